/*
 * A fake NVML (libnvidia-ml.so.1) for the GPU collector's end-to-end tests:
 * agent/tests/gpu_nvml.rs compiles it with `cc -shared` and runs `vtax` with
 * it first on LD_LIBRARY_PATH, so the real NVML backend (nvml-wrapper's
 * loading, every call the collector makes, its units, its error paths, the
 * XID thread) runs without a GPU. CI has no other way to run that code.
 *
 * Only the entry points the agent calls are here, with NVML's signatures and
 * units (nvml.h): power in milliwatts, energy in millijoules, clocks in MHz,
 * PCIe throughput in KB/s, GPM bandwidths in MiB/s, ratios in percent.
 * Built with -DFAKE_NVML_R470 it lacks what the agent calls that came after
 * the R470 branch: GPM (R525), and the v2 memory and v3 process-list calls
 * (R510); their older forms are there, as in every driver. Built with
 * -DFAKE_NVML_R418 as well, it also lacks what came after R418: MIG, GPU
 * instance ids, remapped rows, the v2 process list and the MPS lists. nvml-wrapper then
 * finds those entry points missing at load, as on a node with that driver.
 *
 * Environment:
 *   FAKE_NVML_GPUS=N      GPUs (default 2), unless the state file says `gpus=N`
 *   FAKE_NVML_INIT=code   nvmlInit_v2 fails with this NVML return code
 *   FAKE_NVML_STATE=path  each GPU's state, read again whenever the file
 *                         changes (see `apply` for the keys): one line per
 *                         GPU, `gpu=I key=value ...`; a line without `gpu=`
 *                         sets every GPU
 *   FAKE_NVML_CALLS=path  each call, appended as it is made: `<microseconds>
 *                         <gpu, -1 for none> <thread id> <entry point>`
 */
/* What R470 lacks, R418 lacks too. */
#ifdef FAKE_NVML_R418
#define FAKE_NVML_R470
#endif

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;

enum {
    SUCCESS = 0,
    UNINITIALIZED = 1,
    INVALID_ARGUMENT = 2,
    NOT_SUPPORTED = 3,
    NO_PERMISSION = 4,
    NOT_FOUND = 6,
    INSUFFICIENT_SIZE = 7,
    TIMEOUT = 10,
    GPU_IS_LOST = 15,
};

#define MAX_GPUS 16
#define MAX_LINKS 18
#define MAX_MIG 7
#define MAX_PROCESSES 8
#define MAX_XIDS 16
#define FIELD_MEMORY_TEMPERATURE 82
#define EVENT_XID_CRITICAL 8ULL

/* nvml.h's structs, as nvml-wrapper-sys binds them. */
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {
    unsigned pid;
    unsigned long long timeStamp;
    unsigned smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef union {
    double dVal;
    int siVal;
    unsigned uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;
struct device { int gpu, mig; };
typedef struct device *nvmlDevice_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
struct gpm_sample { int gpu; long long taken_us; };
typedef struct gpm_sample *nvmlGpmSample_t;
typedef struct {
    unsigned metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct { char *shortName, *longName, *unit; } metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[210];
} nvmlGpmMetricsGet_t;
typedef struct { unsigned version, isSupportedDevice; } nvmlGpmSupport_t;
struct event_set { unsigned long long registered[MAX_GPUS]; };
typedef struct event_set *nvmlEventSet_t;

/* What one GPU says. Defaults: an idle H100 SXM in a passed-through VM. */
struct gpu {
    char name[96], uuid[80], bus_id[32];
    unsigned architecture, memory_bus_width_bits;
    unsigned utilization_percent, memory_utilization_percent;
    /* The v2 memory call gives the driver's reservation apart; the v1
       call counts it as used. */
    unsigned long long memory_total_bytes, memory_used_bytes, memory_reserved_bytes;
    unsigned power_mw, power_limit_mw;
    unsigned temperature_c, memory_temperature_c;
    unsigned sm_mhz, memory_mhz, sm_mhz_max, memory_mhz_max;
    unsigned long long clock_event_reasons;
    unsigned pcie_gen, pcie_width, pcie_gen_max, pcie_width_max;
    unsigned pcie_rx_kb_per_s, pcie_tx_kb_per_s, pcie_replays;
    unsigned long long ecc_corrected, ecc_uncorrected;
    unsigned remapped_correctable, remapped_uncorrectable, remap_pending, remap_failed;
    unsigned virtualization_mode;
    /* mig_supported=0: a product without MIG (an L40S, say): the mode
       call answers NOT_SUPPORTED. */
    unsigned mig_supported, mig, mig_instances;
    unsigned nvlinks, nvlinks_up;
    unsigned long long nvlink_crc_errors, nvlink_replay_errors, nvlink_recovery_errors;
    /* The bus ids at the far ends of the links, in turn; none: not supported. */
    unsigned nvlink_remotes;
    char nvlink_remote[MAX_LINKS][32];
    int gpm;
    double gpm_sm_percent, gpm_occupancy_percent, gpm_tensor_percent, gpm_dram_percent;
    double gpm_pcie_rx_mib, gpm_pcie_tx_mib, gpm_nvlink_rx_mib, gpm_nvlink_tx_mib;
    /* processes_error=code: every process-list call fails so (4: no
       permission, as for a MIG parent without the monitor capability). */
    int processes_error;
    unsigned processes, pids[MAX_PROCESSES];
    unsigned long long process_memory_bytes[MAX_PROCESSES];
    unsigned process_sm_percent[MAX_PROCESSES], process_memory_percent[MAX_PROCESSES];
    /* mps_clients=pid:bytes,...: the clients of an MPS server (itself on
       the compute list), on the MPS list alone. */
    unsigned mps_clients, mps_pids[MAX_PROCESSES];
    unsigned long long mps_memory_bytes[MAX_PROCESSES];
    int lost;
    unsigned xids, xid[MAX_XIDS];
    /* event_wait_error=code: waits on a set this GPU is in fail so. */
    int event_wait_error;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* The energy counter: what each GPU has used, in mJ, up to energy_at_us. */
static double energy_mj[MAX_GPUS];
static long long energy_at_us;
static int initialised, gpus = 2;
static struct gpu state[MAX_GPUS];
static struct device handles[MAX_GPUS], mig_handles[MAX_GPUS][MAX_MIG];
/* XIDs of each GPU handed to an event set so far. */
static unsigned xids_delivered[MAX_GPUS];
static struct timespec state_mtime;
static off_t state_size = -1;
static FILE *calls;

static long long now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static void defaults(int i, struct gpu *g) {
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3");
    snprintf(g->uuid, sizeof g->uuid, "GPU-fa4e0000-0000-0000-0000-%012d", i);
    /* As the fake CUDA driver numbers its GPUs' buses. */
    snprintf(g->bus_id, sizeof g->bus_id, "00000000:%02X:00.0", 0x18 + 0x10 * i);
    g->architecture = 9; /* Hopper */
    g->memory_bus_width_bits = 5120;
    g->memory_total_bytes = 80ULL << 30;
    g->memory_used_bytes = 1ULL << 30;
    g->power_mw = 70000;
    g->power_limit_mw = 700000;
    g->temperature_c = 31;
    g->memory_temperature_c = 38;
    g->sm_mhz = 345;
    g->memory_mhz = 2619;
    g->sm_mhz_max = 1980;
    g->memory_mhz_max = 2619;
    g->pcie_gen = 1; /* an idle link trains down */
    g->pcie_width = 16;
    g->pcie_gen_max = 5;
    g->pcie_width_max = 16;
    g->virtualization_mode = 1; /* passthrough */
    g->mig_supported = 1;
    g->nvlinks = MAX_LINKS;
    g->nvlinks_up = MAX_LINKS;
    g->gpm = 1;
}

/* `pid:bytes:sm%:memory%,...` */
static void set_processes(struct gpu *g, const char *v) {
    g->processes = 0;
    while (*v && g->processes < MAX_PROCESSES) {
        unsigned n = g->processes;
        char *end;
        g->pids[n] = (unsigned)strtoul(v, &end, 10);
        g->process_memory_bytes[n] = 0;
        g->process_sm_percent[n] = g->process_memory_percent[n] = 0;
        if (*end == ':') g->process_memory_bytes[n] = strtoull(end + 1, &end, 10);
        if (*end == ':') g->process_sm_percent[n] = (unsigned)strtoul(end + 1, &end, 10);
        if (*end == ':') g->process_memory_percent[n] = (unsigned)strtoul(end + 1, &end, 10);
        if (end == v) break;
        g->processes++;
        v = *end == ',' ? end + 1 : end;
        if (!*end) break;
    }
}

/* `pid:bytes,...` */
static void set_mps_clients(struct gpu *g, const char *v) {
    g->mps_clients = 0;
    while (*v && g->mps_clients < MAX_PROCESSES) {
        char *end;
        unsigned n = g->mps_clients;
        g->mps_pids[n] = (unsigned)strtoul(v, &end, 10);
        if (end == v) break;
        g->mps_memory_bytes[n] = *end == ':' ? strtoull(end + 1, &end, 10) : 0;
        g->mps_clients++;
        if (*end != ',') break;
        v = end + 1;
    }
}

static void set_nvlink_remotes(struct gpu *g, const char *v) {
    g->nvlink_remotes = 0;
    while (*v && g->nvlink_remotes < MAX_LINKS) {
        const char *end = strchr(v, ',');
        size_t n = end ? (size_t)(end - v) : strlen(v);
        if (n >= sizeof g->nvlink_remote[0]) n = sizeof g->nvlink_remote[0] - 1;
        memcpy(g->nvlink_remote[g->nvlink_remotes], v, n);
        g->nvlink_remote[g->nvlink_remotes++][n] = 0;
        if (!end) break;
        v = end + 1;
    }
}

static void set_xids(struct gpu *g, const char *v) {
    g->xids = 0;
    while (*v && g->xids < MAX_XIDS) {
        char *end;
        g->xid[g->xids++] = (unsigned)strtoul(v, &end, 10);
        if (*end != ',') break;
        v = end + 1;
    }
}

static void apply(struct gpu *g, const char *key, const char *v) {
    unsigned long long n = strtoull(v, NULL, 10);
    double x = strtod(v, NULL);
#define U(k, field) else if (strcmp(key, k) == 0) g->field = (unsigned)n;
#define ULL(k, field) else if (strcmp(key, k) == 0) g->field = n;
#define D(k, field) else if (strcmp(key, k) == 0) g->field = x;
#define S(k, field) else if (strcmp(key, k) == 0) snprintf(g->field, sizeof g->field, "%s", v);
    if (0) {}
    S("name", name) S("uuid", uuid) S("bus_id", bus_id)
    U("architecture", architecture)
    U("utilization", utilization_percent) U("memory_utilization", memory_utilization_percent)
    ULL("memory_total", memory_total_bytes) ULL("memory_used", memory_used_bytes)
    ULL("memory_reserved", memory_reserved_bytes)
    U("power_mw", power_mw) U("power_limit_mw", power_limit_mw)
    U("temperature", temperature_c) U("memory_temperature", memory_temperature_c)
    U("sm_mhz", sm_mhz) U("memory_mhz", memory_mhz)
    ULL("clock_event_reasons", clock_event_reasons)
    U("pcie_gen", pcie_gen) U("pcie_width", pcie_width)
    U("pcie_gen_max", pcie_gen_max) U("pcie_width_max", pcie_width_max)
    U("pcie_rx_kb", pcie_rx_kb_per_s) U("pcie_tx_kb", pcie_tx_kb_per_s)
    U("pcie_replays", pcie_replays)
    ULL("ecc_corrected", ecc_corrected) ULL("ecc_uncorrected", ecc_uncorrected)
    U("remapped_correctable", remapped_correctable)
    U("remapped_uncorrectable", remapped_uncorrectable)
    U("remap_pending", remap_pending) U("remap_failed", remap_failed)
    U("virtualization", virtualization_mode)
    U("mig_supported", mig_supported) U("mig", mig) U("mig_instances", mig_instances)
    U("nvlinks", nvlinks) U("nvlinks_up", nvlinks_up)
    ULL("nvlink_crc_errors", nvlink_crc_errors)
    ULL("nvlink_replay_errors", nvlink_replay_errors)
    ULL("nvlink_recovery_errors", nvlink_recovery_errors)
    U("gpm", gpm)
    D("gpm_sm", gpm_sm_percent) D("gpm_occupancy", gpm_occupancy_percent)
    D("gpm_tensor", gpm_tensor_percent) D("gpm_dram", gpm_dram_percent)
    D("gpm_pcie_rx_mib", gpm_pcie_rx_mib) D("gpm_pcie_tx_mib", gpm_pcie_tx_mib)
    D("gpm_nvlink_rx_mib", gpm_nvlink_rx_mib) D("gpm_nvlink_tx_mib", gpm_nvlink_tx_mib)
    U("lost", lost) U("event_wait_error", event_wait_error)
    U("processes_error", processes_error)
    /* The energy counter starts again from this many mJ (a reset). */
    else if (strcmp(key, "energy_mj") == 0) energy_mj[g - state] = x;
    else if (strcmp(key, "processes") == 0) set_processes(g, v);
    else if (strcmp(key, "mps_clients") == 0) set_mps_clients(g, v);
    else if (strcmp(key, "xids") == 0) set_xids(g, v);
    else if (strcmp(key, "nvlink_remote") == 0) set_nvlink_remotes(g, v);
#undef U
#undef ULL
#undef D
#undef S
}

/* Energy used up to now at each GPU's power so far, before the power changes. */
static void settle_energy(void) {
    long long now = now_us();
    if (energy_at_us)
        for (int i = 0; i < MAX_GPUS; i++)
            energy_mj[i] += state[i].power_mw * (double)(now - energy_at_us) / 1e6;
    energy_at_us = now;
}

/* Reads the state file again if it changed since the last read. */
static void refresh(void) {
    const char *path = getenv("FAKE_NVML_STATE");
    struct stat st;
    if (!path || stat(path, &st) != 0) return;
    if (st.st_size == state_size && st.st_mtim.tv_sec == state_mtime.tv_sec &&
        st.st_mtim.tv_nsec == state_mtime.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    state_size = st.st_size;
    state_mtime = st.st_mtim;
    settle_energy();
    const char *n = getenv("FAKE_NVML_GPUS");
    gpus = n ? atoi(n) : 2;
    for (int i = 0; i < MAX_GPUS; i++) defaults(i, &state[i]);
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        int only = -1;
        char *save, *word;
        /* A `gpu=` word anywhere says which GPU the line is for. */
        for (char *at = line; (at = strstr(at, "gpu=")); at += 4)
            if (at == line || at[-1] == ' ' || at[-1] == '\t') only = atoi(at + 4);
        for (word = strtok_r(line, " \t\n", &save); word; word = strtok_r(NULL, " \t\n", &save)) {
            char *eq = strchr(word, '=');
            if (!eq) continue;
            *eq = 0;
            if (strcmp(word, "gpu") == 0) continue;
            if (strcmp(word, "gpus") == 0) {
                gpus = atoi(eq + 1);
                continue;
            }
            for (int i = 0; i < MAX_GPUS; i++)
                if (only < 0 || only == i) apply(&state[i], word, eq + 1);
        }
    }
    fclose(f);
    if (gpus > MAX_GPUS) gpus = MAX_GPUS;
    if (gpus < 0) gpus = 0;
}

/* A MIG instance's calls are logged as `<entry point>@mig<index>`. */
static void log_call_of(int gpu, int mig, const char *call) {
    if (!calls) {
        const char *path = getenv("FAKE_NVML_CALLS");
        if (!path || !(calls = fopen(path, "a"))) return;
    }
    long thread = syscall(SYS_gettid);
    if (mig >= 0)
        fprintf(calls, "%lld %d %ld %s@mig%d\n", now_us(), gpu, thread, call, mig);
    else
        fprintf(calls, "%lld %d %ld %s\n", now_us(), gpu, thread, call);
    fflush(calls);
}

static void log_call(int gpu, const char *call) { log_call_of(gpu, -1, call); }

/* Every entry point holds the lock from `enter` to its return. */
#define RETURN(rc) do { nvmlReturn_t rc_ = (rc); pthread_mutex_unlock(&lock); return rc_; } while (0)
#define ENTER_OF(call, gpu, mig)                          \
    pthread_mutex_lock(&lock);                            \
    if (!initialised) RETURN(UNINITIALIZED);              \
    refresh();                                            \
    log_call_of((gpu), (mig), (call))
#define ENTER(call, gpu) ENTER_OF(call, gpu, -1)

/* A device call: a handle of a GPU that is there; `g` is its state. */
#define DEVICE(call)                                                        \
    if (!device) return INVALID_ARGUMENT;                                   \
    ENTER_OF(call, device->gpu, device->mig);                               \
    if (device->gpu < 0 || device->gpu >= gpus) RETURN(INVALID_ARGUMENT);   \
    struct gpu *g = &state[device->gpu];                                    \
    if (g->lost) RETURN(GPU_IS_LOST)
#define OUT(p) do { if (!(p)) RETURN(INVALID_ARGUMENT); } while (0)

static void init_state(void) {
    const char *n = getenv("FAKE_NVML_GPUS");
    gpus = n ? atoi(n) : 2;
    for (int i = 0; i < MAX_GPUS; i++) {
        defaults(i, &state[i]);
        handles[i] = (struct device){i, -1};
        for (int m = 0; m < MAX_MIG; m++) mig_handles[i][m] = (struct device){i, m};
    }
    state_size = -1;
    refresh();
    settle_energy();
}

nvmlReturn_t nvmlInit_v2(void) {
    const char *fail = getenv("FAKE_NVML_INIT");
    if (fail && atoi(fail) != 0) return atoi(fail);
    pthread_mutex_lock(&lock);
    if (!initialised) init_state();
    initialised++;
    log_call(-1, "nvmlInit_v2");
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void) {
    ENTER("nvmlShutdown", -1);
    initialised--;
    RETURN(SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case SUCCESS: return "Success";
    case NOT_SUPPORTED: return "Not Supported";
    case GPU_IS_LOST: return "GPU is lost";
    case NO_PERMISSION: return "Insufficient Permissions";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) {
    ENTER("nvmlSystemGetDriverVersion", -1);
    OUT(version);
#if defined(FAKE_NVML_R418)
    snprintf(version, length, "418.226.00");
#elif defined(FAKE_NVML_R470)
    snprintf(version, length, "470.256.02");
#else
    snprintf(version, length, "550.54.15");
#endif
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    ENTER("nvmlDeviceGetCount_v2", -1);
    OUT(count);
    *count = (unsigned)gpus;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device) {
    ENTER("nvmlDeviceGetHandleByIndex_v2", (int)index);
    OUT(device);
    if (index >= (unsigned)gpus) RETURN(INVALID_ARGUMENT);
    *device = &handles[index];
    RETURN(SUCCESS);
}

static unsigned mig_memory_total(const struct gpu *g) {
    return g->mig_instances ? (unsigned)(g->memory_total_bytes / g->mig_instances >> 20) : 0;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned length) {
    DEVICE("nvmlDeviceGetName");
    OUT(name);
    if (device->mig >= 0)
        snprintf(name, length, "%s MIG 1g.%uGB", g->name, mig_memory_total(g) >> 10);
    else
        snprintf(name, length, "%s", g->name);
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned length) {
    DEVICE("nvmlDeviceGetUUID");
    OUT(uuid);
    if (device->mig >= 0)
        snprintf(uuid, length, "MIG-%s-%d", g->uuid + 4, device->mig);
    else
        snprintf(uuid, length, "%s", g->uuid);
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEVICE("nvmlDeviceGetPciInfo_v3");
    OUT(pci);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", g->bus_id + 4);
    sscanf(g->bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = 0x233010de;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned *architecture) {
    DEVICE("nvmlDeviceGetArchitecture");
    OUT(architecture);
    *architecture = g->architecture;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryBusWidth(nvmlDevice_t device, unsigned *bits) {
    DEVICE("nvmlDeviceGetMemoryBusWidth");
    OUT(bits);
    *bits = g->memory_bus_width_bits;
    RETURN(SUCCESS);
}

static nvmlReturn_t clock_of(const struct gpu *g, unsigned type, int max, unsigned *mhz) {
    switch (type) {
    case 1: *mhz = max ? g->sm_mhz_max : g->sm_mhz; return SUCCESS;     /* SM */
    case 2: *mhz = max ? g->memory_mhz_max : g->memory_mhz; return SUCCESS; /* memory */
    default: return NOT_SUPPORTED;
    }
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, unsigned type, unsigned *mhz) {
    DEVICE("nvmlDeviceGetMaxClockInfo");
    OUT(mhz);
    RETURN(clock_of(g, type, 1, mhz));
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned type, unsigned *mhz) {
    DEVICE("nvmlDeviceGetClockInfo");
    OUT(mhz);
    RETURN(clock_of(g, type, 0, mhz));
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned *gen) {
    DEVICE("nvmlDeviceGetMaxPcieLinkGeneration");
    OUT(gen);
    *gen = g->pcie_gen_max;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned *width) {
    DEVICE("nvmlDeviceGetMaxPcieLinkWidth");
    OUT(width);
    *width = g->pcie_width_max;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned *gen) {
    DEVICE("nvmlDeviceGetCurrPcieLinkGeneration");
    OUT(gen);
    *gen = g->pcie_gen;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned *width) {
    DEVICE("nvmlDeviceGetCurrPcieLinkWidth");
    OUT(width);
    *width = g->pcie_width;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, unsigned counter, unsigned *kb) {
    DEVICE("nvmlDeviceGetPcieThroughput");
    OUT(kb);
    if (counter > 1) RETURN(INVALID_ARGUMENT);
    /* The real call holds its caller for a 20 ms sampling window; this one answers at once. */
    *kb = counter == 0 ? g->pcie_tx_kb_per_s : g->pcie_rx_kb_per_s;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned *value) {
    DEVICE("nvmlDeviceGetPcieReplayCounter");
    OUT(value);
    *value = g->pcie_replays;
    RETURN(SUCCESS);
}

/* Total, used apart from the reservation, and the reservation, of a GPU or
   of a MIG instance (which takes its share of each). */
static void memory_of(nvmlDevice_t device, const struct gpu *g, unsigned long long *total,
                      unsigned long long *used, unsigned long long *reserved) {
    unsigned long long instances = g->mig_instances ? g->mig_instances : 1;
    *total = g->memory_total_bytes;
    *used = g->memory_used_bytes;
    *reserved = g->memory_reserved_bytes;
    if (device->mig >= 0) {
        *total = (unsigned long long)mig_memory_total(g) << 20;
        *used /= instances;
        *reserved /= instances;
    }
}

#ifndef FAKE_NVML_R470
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    DEVICE("nvmlDeviceGetMemoryInfo_v2");
    OUT(memory);
    unsigned long long total, used, reserved;
    memory_of(device, g, &total, &used, &reserved);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total - used - reserved;
    RETURN(SUCCESS);
}
#endif

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEVICE("nvmlDeviceGetMemoryInfo");
    OUT(memory);
    unsigned long long total, used, reserved;
    memory_of(device, g, &total, &used, &reserved);
    memory->total = total;
    memory->used = used + reserved;
    memory->free = total - used - reserved;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    DEVICE("nvmlDeviceGetUtilizationRates");
    OUT(u);
    /* With MIG on there is no GPU-wide utilisation. */
    if (g->mig) RETURN(NOT_SUPPORTED);
    u->gpu = g->utilization_percent;
    u->memory = g->memory_utilization_percent;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned *mw) {
    DEVICE("nvmlDeviceGetPowerUsage");
    OUT(mw);
    *mw = g->power_mw;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned *mw) {
    DEVICE("nvmlDeviceGetEnforcedPowerLimit");
    OUT(mw);
    *mw = g->power_limit_mw;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *mj) {
    DEVICE("nvmlDeviceGetTotalEnergyConsumption");
    OUT(mj);
    settle_energy();
    *mj = (unsigned long long)energy_mj[device->gpu];
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned sensor, unsigned *c) {
    DEVICE("nvmlDeviceGetTemperature");
    OUT(c);
    if (sensor != 0) RETURN(INVALID_ARGUMENT);
    *c = g->temperature_c;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    DEVICE("nvmlDeviceGetFieldValues");
    OUT(values);
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = now_us();
        v->latencyUsec = 0;
        if (v->fieldId == FIELD_MEMORY_TEMPERATURE) {
            v->valueType = 1; /* unsigned int */
            v->value.uiVal = g->memory_temperature_c;
            v->nvmlReturn = SUCCESS;
        } else {
            v->nvmlReturn = NOT_SUPPORTED;
        }
    }
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *reasons) {
    DEVICE("nvmlDeviceGetCurrentClocksThrottleReasons");
    OUT(reasons);
    *reasons = g->clock_event_reasons;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned type, unsigned counter,
                                         unsigned long long *count) {
    DEVICE("nvmlDeviceGetTotalEccErrors");
    OUT(count);
    if (type > 1 || counter > 1) RETURN(INVALID_ARGUMENT);
    *count = type == 0 ? g->ecc_corrected : g->ecc_uncorrected;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t device, unsigned *mode) {
    DEVICE("nvmlDeviceGetVirtualizationMode");
    OUT(mode);
    *mode = g->virtualization_mode;
    RETURN(SUCCESS);
}

#ifndef FAKE_NVML_R418
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned *current, unsigned *pending) {
    DEVICE("nvmlDeviceGetMigMode");
    OUT(current && pending);
    if (!g->mig_supported) RETURN(NOT_SUPPORTED);
    *current = *pending = g->mig ? 1 : 0;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned *count) {
    DEVICE("nvmlDeviceGetMaxMigDeviceCount");
    OUT(count);
    *count = g->mig ? MAX_MIG : 0;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned index,
                                                 nvmlDevice_t *mig) {
    DEVICE("nvmlDeviceGetMigDeviceHandleByIndex");
    OUT(mig);
    if (!g->mig || index >= g->mig_instances || index >= MAX_MIG) RETURN(NOT_FOUND);
    *mig = &mig_handles[device->gpu][index];
    RETURN(SUCCESS);
}
#endif

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned link, unsigned *active) {
    DEVICE("nvmlDeviceGetNvLinkState");
    OUT(active);
    /* A link the product lacks, or a hypervisor hides. */
    if (link >= g->nvlinks) RETURN(NOT_SUPPORTED);
    *active = link < g->nvlinks_up;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned link,
                                                 nvmlPciInfo_t *pci) {
    DEVICE("nvmlDeviceGetNvLinkRemotePciInfo_v2");
    OUT(pci);
    if (link >= g->nvlinks || !g->nvlink_remotes) RETURN(NOT_SUPPORTED);
    const char *bus = g->nvlink_remote[link % g->nvlink_remotes];
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus);
    sscanf(bus, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned link, unsigned counter,
                                             unsigned long long *value) {
    DEVICE("nvmlDeviceGetNvLinkErrorCounter");
    OUT(value);
    if (link >= g->nvlinks) RETURN(NOT_SUPPORTED);
    /* Link 0 carries the GPU's errors. */
    unsigned long long errors[] = {g->nvlink_replay_errors, g->nvlink_recovery_errors,
                                   g->nvlink_crc_errors};
    if (counter > 3) RETURN(INVALID_ARGUMENT);
    *value = link == 0 && counter < 3 ? errors[counter] : 0;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *samples,
                                             unsigned *count, unsigned long long last_seen_us) {
    DEVICE("nvmlDeviceGetProcessUtilization");
    OUT(count);
    /* As the driver: one sample, stamped now and newer than any seen, per
       process that used the GPU (SM or memory above 0); none at all is
       NOT_FOUND. */
    long long now = now_us();
    unsigned n = 0;
    if ((unsigned long long)now > last_seen_us)
        for (unsigned i = 0; i < g->processes; i++)
            n += g->process_sm_percent[i] || g->process_memory_percent[i];
    if (!n) RETURN(NOT_FOUND);
    if (!samples || *count < n) {
        *count = n;
        RETURN(INSUFFICIENT_SIZE);
    }
    unsigned k = 0;
    for (unsigned i = 0; i < g->processes; i++)
        if (g->process_sm_percent[i] || g->process_memory_percent[i])
            samples[k++] = (nvmlProcessUtilizationSample_t){
                g->pids[i], (unsigned long long)now, g->process_sm_percent[i],
                g->process_memory_percent[i], 0, 0};
    *count = n;
    RETURN(SUCCESS);
}

/* The process list in each of its three versions: v1 has no instance ids;
   v2 and v3 share a struct (v3 changed what a process under MPS is). */
#define PROCESS_LIST(call, infos, fill) LIST_OF(call, infos, g->processes, fill)
#define MPS_LIST(call, infos, fill) LIST_OF(call, infos, g->mps_clients, fill)
#define LIST_OF(call, infos, n, fill)                                    \
    DEVICE(call);                                                        \
    OUT(count);                                                          \
    if (g->processes_error) RETURN(g->processes_error);                  \
    if (!(infos) || *count < (n)) {                                      \
        *count = (n);                                                    \
        RETURN((n) ? INSUFFICIENT_SIZE : SUCCESS);                       \
    }                                                                    \
    for (unsigned i = 0; i < (n); i++) fill;                             \
    *count = (n);                                                        \
    RETURN(SUCCESS)

static inline nvmlProcessInfo_t process_info(const struct gpu *g, unsigned i) {
    unsigned instance = g->mig && g->mig_instances ? 1 + 2 * (i % g->mig_instances) : 0xFFFFFFFF;
    return (nvmlProcessInfo_t){g->pids[i], g->process_memory_bytes[i], instance,
                               g->mig ? 0 : 0xFFFFFFFF};
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned *count,
                                                  nvmlProcessInfo_v1_t *infos) {
    PROCESS_LIST("nvmlDeviceGetComputeRunningProcesses", infos,
                 infos[i] = ((nvmlProcessInfo_v1_t){g->pids[i], g->process_memory_bytes[i]}));
}

static inline nvmlProcessInfo_t mps_client_info(const struct gpu *g, unsigned i) {
    return (nvmlProcessInfo_t){g->mps_pids[i], g->mps_memory_bytes[i], 0xFFFFFFFF, 0xFFFFFFFF};
}

#ifndef FAKE_NVML_R418
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned *count,
                                                     nvmlProcessInfo_v1_t *infos) {
    MPS_LIST("nvmlDeviceGetMPSComputeRunningProcesses", infos,
             infos[i] = ((nvmlProcessInfo_v1_t){g->mps_pids[i], g->mps_memory_bytes[i]}));
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device, unsigned *count,
                                                        nvmlProcessInfo_t *infos) {
    MPS_LIST("nvmlDeviceGetMPSComputeRunningProcesses_v2", infos, infos[i] = mps_client_info(g, i));
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned *count,
                                                     nvmlProcessInfo_t *infos) {
    PROCESS_LIST("nvmlDeviceGetComputeRunningProcesses_v2", infos, infos[i] = process_info(g, i));
}
#endif

#ifndef FAKE_NVML_R470
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned *count,
                                                     nvmlProcessInfo_t *infos) {
    PROCESS_LIST("nvmlDeviceGetComputeRunningProcesses_v3", infos, infos[i] = process_info(g, i));
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned *count,
                                                        nvmlProcessInfo_t *infos) {
    MPS_LIST("nvmlDeviceGetMPSComputeRunningProcesses_v3", infos, infos[i] = mps_client_info(g, i));
}
#endif

#ifndef FAKE_NVML_R418
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned *correctable,
                                       unsigned *uncorrectable, unsigned *pending,
                                       unsigned *failed) {
    DEVICE("nvmlDeviceGetRemappedRows");
    OUT(correctable && uncorrectable && pending && failed);
    *correctable = g->remapped_correctable;
    *uncorrectable = g->remapped_uncorrectable;
    *pending = g->remap_pending;
    *failed = g->remap_failed;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned *id) {
    DEVICE("nvmlDeviceGetGpuInstanceId");
    OUT(id);
    if (device->mig < 0) RETURN(INVALID_ARGUMENT);
    /* Instance ids are not the handles' indices: profiles place them apart. */
    *id = 1 + 2 * (unsigned)device->mig;
    RETURN(SUCCESS);
}

#endif

#ifndef FAKE_NVML_R470
nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    DEVICE("nvmlGpmQueryDeviceSupport");
    OUT(support);
    if (support->version != 1) RETURN(INVALID_ARGUMENT);
    support->isSupportedDevice = g->gpm ? 1 : 0;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    ENTER("nvmlGpmSampleAlloc", -1);
    OUT(sample);
    *sample = calloc(1, sizeof **sample);
    (*sample)->gpu = -1;
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    ENTER("nvmlGpmSampleFree", sample ? sample->gpu : -1);
    OUT(sample);
    free(sample);
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
    DEVICE("nvmlGpmSampleGet");
    OUT(sample);
    if (!g->gpm) RETURN(NOT_SUPPORTED);
    sample->gpu = device->gpu;
    sample->taken_us = now_us();
    RETURN(SUCCESS);
}

static char unit_percent[] = "%", unit_mib[] = "MiB/sec", no_name[] = "";

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *get) {
    ENTER("nvmlGpmMetricsGet", get && get->sample1 ? get->sample1->gpu : -1);
    OUT(get && get->sample1 && get->sample2);
    if (get->version != 1 || get->numMetrics > 210) RETURN(INVALID_ARGUMENT);
    /* Two samples of the same GPU, the second later. */
    if (get->sample1->gpu < 0 || get->sample1->gpu != get->sample2->gpu ||
        get->sample2->taken_us <= get->sample1->taken_us)
        RETURN(INVALID_ARGUMENT);
    const struct gpu *g = &state[get->sample1->gpu];
    double up = g->nvlinks_up ? g->nvlinks_up : 1;
    for (unsigned i = 0; i < get->numMetrics; i++) {
        nvmlGpmMetric_t *m = &get->metrics[i];
        unsigned id = m->metricId;
        m->nvmlReturn = SUCCESS;
        m->metricInfo.shortName = m->metricInfo.longName = no_name;
        m->metricInfo.unit = unit_percent;
        switch (id) {
        case 2: m->value = g->gpm_sm_percent; break;
        case 3: m->value = g->gpm_occupancy_percent; break;
        case 5: m->value = g->gpm_tensor_percent; break;
        case 10: m->value = g->gpm_dram_percent; break;
        case 20: m->value = g->gpm_pcie_tx_mib; break;
        case 21: m->value = g->gpm_pcie_rx_mib; break;
        case 60: m->value = g->gpm_nvlink_rx_mib; break;
        case 61: m->value = g->gpm_nvlink_tx_mib; break;
        default:
            if (id >= 62 && id <= 97) {
                /* Link n: receive 62 + 2n, transmit 63 + 2n; the total over the links up. */
                unsigned link = (id - 62) / 2;
                double total = (id - 62) % 2 ? g->gpm_nvlink_tx_mib : g->gpm_nvlink_rx_mib;
                m->value = link < g->nvlinks_up ? total / up : 0;
            } else {
                m->nvmlReturn = NOT_SUPPORTED;
            }
        }
        if (id >= 20) m->metricInfo.unit = unit_mib;
    }
    RETURN(SUCCESS);
}
#endif

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    ENTER("nvmlEventSetCreate", -1);
    OUT(set);
    *set = calloc(1, sizeof **set);
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    ENTER("nvmlEventSetFree", -1);
    free(set);
    RETURN(SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                      nvmlEventSet_t set) {
    DEVICE("nvmlDeviceRegisterEvents");
    OUT(set);
    set->registered[device->gpu] |= types;
    RETURN(SUCCESS);
}

/* Hands out each GPU's XIDs that the state file lists and no wait has yet;
 * only a wait that returns one is logged. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeout_ms) {
    if (!set || !data) return INVALID_ARGUMENT;
    long long deadline = now_us() + (long long)timeout_ms * 1000;
    for (;;) {
        pthread_mutex_lock(&lock);
        if (!initialised) RETURN(UNINITIALIZED);
        refresh();
        for (int i = 0; i < gpus; i++)
            if ((set->registered[i] & EVENT_XID_CRITICAL) && state[i].event_wait_error) {
                log_call(i, "nvmlEventSetWait_v2");
                RETURN(state[i].event_wait_error);
            }
        for (int i = 0; i < gpus; i++) {
            if (!(set->registered[i] & EVENT_XID_CRITICAL) || xids_delivered[i] >= state[i].xids)
                continue;
            log_call(i, "nvmlEventSetWait_v2");
            memset(data, 0, sizeof *data);
            data->device = &handles[i];
            data->eventType = EVENT_XID_CRITICAL;
            data->eventData = state[i].xid[xids_delivered[i]++];
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
            RETURN(SUCCESS);
        }
        pthread_mutex_unlock(&lock);
        if (now_us() >= deadline) return TIMEOUT;
        usleep(20000);
    }
}
