/*
 * A fake CUDA driver (libcuda.so.1) for the GPU probe's end-to-end tests:
 * agent/tests/probe_gpu.rs compiles it with `cc -shared` and runs `vtax
 * probe-gpu` with it first on LD_LIBRARY_PATH, so the CUDA engine's real
 * code (loading, call order, timing arithmetic, guards) runs without a GPU.
 *
 * Only the entry points the probe declares are here, with the driver's
 * signatures. Time is a virtual GPU clock that each copy and launch moves
 * on at a fixed rate; events read it. The rates differ by GPU, so a test can
 * tell the GPUs apart in the figures.
 *
 * Environment:
 *   FAKE_CUDA_GPUS=N        GPUs (default 2; 0: cuInit says CUDA_ERROR_NO_DEVICE)
 *   FAKE_CUDA_FAIL=call@gpu every call of that entry point fails with
 *                           CUDA_ERROR_OUT_OF_MEMORY while that GPU's context is current
 *   FAKE_CUDA_NO_PEER=1     no pair has peer access
 *   FAKE_CUDA_LEDGER=path   at exit, what is still allocated, retained or created
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
    OK = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    NO_DEVICE = 100,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    INVALID_PTX = 218,
    INVALID_HANDLE = 400,
    NOT_FOUND = 500,
    PEER_ACCESS_ALREADY_ENABLED = 704,
};

#define MAX_GPUS 16

struct ctx { int dev; int refs; int peer[MAX_GPUS]; };
struct stream { struct ctx *ctx; };
struct event { struct ctx *ctx; double t; int recorded; };
struct module { struct ctx *ctx; };
struct buffer { int dev; size_t bytes; };

static struct ctx contexts[MAX_GPUS];
static __thread struct ctx *current;
static int initialised, gpus = 2;
static double clock_s;
static long device_buffers, host_buffers, streams, events, modules;
static char fail_call[64];
static int fail_gpu = -1;

static double h2d_rate(int dev) { return (20.0 + 10.0 * dev) * 1e9; }
static double d2h_rate(int dev) { return (15.0 + 10.0 * dev) * 1e9; }
static double d2d_rate(int dev) { return (1000.0 + 100.0 * dev) * 1e9; }
static double peer_rate(int src, int dst) { return (100.0 + 10.0 * src + dst) * 1e9; }
static const double kernel_s = 3e-6, small_copy_s = 1e-6;

static int failing(const char *call) {
    return current && current->dev == fail_gpu && strcmp(call, fail_call) == 0;
}
#define ENTER(call)                                   \
    do {                                              \
        if (!initialised) return NOT_INITIALIZED;     \
        if (failing(call)) return OUT_OF_MEMORY;      \
    } while (0)
#define NEED_CONTEXT() do { if (!current) return INVALID_CONTEXT; } while (0)

/* Device buffers carry a header saying whose they are. */
static struct buffer *buffer_of(CUdeviceptr p) { return (struct buffer *)(uintptr_t)p - 1; }

CUresult cuInit(unsigned flags) {
    if (flags != 0) return INVALID_VALUE;
    const char *n = getenv("FAKE_CUDA_GPUS");
    if (n) gpus = atoi(n);
    if (gpus > MAX_GPUS) gpus = MAX_GPUS;
    const char *f = getenv("FAKE_CUDA_FAIL");
    if (f) {
        const char *at = strchr(f, '@');
        if (at && (size_t)(at - f) < sizeof fail_call) {
            memcpy(fail_call, f, at - f);
            fail_gpu = atoi(at + 1);
        }
    }
    if (gpus <= 0) return NO_DEVICE;
    initialised = 1;
    return OK;
}

CUresult cuDeviceGetCount(int *count) { ENTER("cuDeviceGetCount"); *count = gpus; return OK; }

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    ENTER("cuDeviceGet");
    if (ordinal < 0 || ordinal >= gpus) return INVALID_DEVICE;
    *d = ordinal;
    return OK;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    ENTER("cuDeviceGetName");
    snprintf(name, len, "Fake GPU %d", d);
    return OK;
}

CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice d) {
    ENTER("cuDeviceGetPCIBusId");
    snprintf(id, len, "0000:%02X:00.0", 0x18 + 0x10 * d);
    return OK;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d) {
    ENTER("cuDevicePrimaryCtxRetain");
    if (d < 0 || d >= gpus) return INVALID_DEVICE;
    contexts[d].dev = d;
    contexts[d].refs++;
    *ctx = &contexts[d];
    return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (d < 0 || d >= gpus || contexts[d].refs == 0) return INVALID_CONTEXT;
    if (--contexts[d].refs == 0) memset(contexts[d].peer, 0, sizeof contexts[d].peer);
    return OK;
}

CUresult cuCtxSetCurrent(void *ctx) {
    if (!initialised) return NOT_INITIALIZED;
    struct ctx *c = ctx;
    if (c && c->refs == 0) return INVALID_CONTEXT;
    current = c;
    return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    ENTER("cuMemAlloc_v2");
    NEED_CONTEXT();
    struct buffer *b = malloc(sizeof *b + bytes);
    if (!b) return OUT_OF_MEMORY;
    b->dev = current->dev;
    b->bytes = bytes;
    device_buffers++;
    *p = (CUdeviceptr)(uintptr_t)(b + 1);
    return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    if (!p) return INVALID_VALUE;
    free(buffer_of(p));
    device_buffers--;
    return OK;
}

CUresult cuMemAllocHost_v2(void **p, size_t bytes) {
    ENTER("cuMemAllocHost_v2");
    NEED_CONTEXT();
    *p = malloc(bytes);
    if (!*p) return OUT_OF_MEMORY;
    host_buffers++;
    return OK;
}

CUresult cuMemFreeHost(void *p) {
    if (!p) return INVALID_VALUE;
    free(p);
    host_buffers--;
    return OK;
}

static CUresult check_stream(void *s) {
    struct stream *st = s;
    if (!st) return INVALID_HANDLE;  /* the probe never uses the legacy stream */
    if (st->ctx != current) return INVALID_CONTEXT;
    return OK;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
    ENTER("cuMemcpyHtoDAsync_v2");
    CUresult r = check_stream(s);
    if (r) return r;
    if (n > buffer_of(dst)->bytes) return INVALID_VALUE;
    memcpy((void *)(uintptr_t)dst, src, n);
    clock_s += n <= 64 ? small_copy_s : n / h2d_rate(buffer_of(dst)->dev);
    return OK;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) {
    ENTER("cuMemcpyDtoHAsync_v2");
    CUresult r = check_stream(s);
    if (r) return r;
    if (n > buffer_of(src)->bytes) return INVALID_VALUE;
    memcpy(dst, (void *)(uintptr_t)src, n);
    clock_s += n <= 64 ? small_copy_s : n / d2h_rate(buffer_of(src)->dev);
    return OK;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
    ENTER("cuMemcpyDtoDAsync_v2");
    CUresult r = check_stream(s);
    if (r) return r;
    if (n > buffer_of(dst)->bytes || n > buffer_of(src)->bytes) return INVALID_VALUE;
    if (buffer_of(dst)->dev != buffer_of(src)->dev) return INVALID_VALUE;
    memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
    clock_s += n / d2d_rate(buffer_of(src)->dev);
    return OK;
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, void *dst_ctx, CUdeviceptr src, void *src_ctx,
                           size_t n, void *s) {
    ENTER("cuMemcpyPeerAsync");
    CUresult r = check_stream(s);
    if (r) return r;
    struct ctx *dc = dst_ctx, *sc = src_ctx;
    if (buffer_of(dst)->dev != dc->dev || buffer_of(src)->dev != sc->dev) return INVALID_VALUE;
    if (!sc->peer[dc->dev]) return INVALID_VALUE;  /* the probe enables access first */
    memcpy((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
    clock_s += n / peer_rate(sc->dev, dc->dev);
    return OK;
}

CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
    ENTER("cuDeviceCanAccessPeer");
    *can = d != peer && !getenv("FAKE_CUDA_NO_PEER");
    return OK;
}

CUresult cuCtxEnablePeerAccess(void *peer, unsigned flags) {
    ENTER("cuCtxEnablePeerAccess");
    NEED_CONTEXT();
    struct ctx *p = peer;
    if (flags || !p || p == current) return INVALID_VALUE;
    if (current->peer[p->dev]) return PEER_ACCESS_ALREADY_ENABLED;
    current->peer[p->dev] = 1;
    return OK;
}

CUresult cuStreamCreate(void **s, unsigned flags) {
    ENTER("cuStreamCreate");
    NEED_CONTEXT();
    (void)flags;
    struct stream *st = malloc(sizeof *st);
    st->ctx = current;
    streams++;
    *s = st;
    return OK;
}

CUresult cuStreamSynchronize(void *s) { ENTER("cuStreamSynchronize"); return s ? OK : INVALID_HANDLE; }

CUresult cuStreamDestroy_v2(void *s) {
    if (!s) return INVALID_HANDLE;
    free(s);
    streams--;
    return OK;
}

CUresult cuEventCreate(void **e, unsigned flags) {
    ENTER("cuEventCreate");
    NEED_CONTEXT();
    if (flags & 2) return INVALID_VALUE; /* CU_EVENT_DISABLE_TIMING: the probe times */
    struct event *ev = calloc(1, sizeof *ev);
    ev->ctx = current;
    events++;
    *e = ev;
    return OK;
}

CUresult cuEventRecord(void *e, void *s) {
    ENTER("cuEventRecord");
    struct event *ev = e;
    struct stream *st = s;
    if (!ev || !st || ev->ctx != st->ctx) return INVALID_HANDLE;
    ev->t = clock_s;
    ev->recorded = 1;
    return OK;
}

CUresult cuEventSynchronize(void *e) { ENTER("cuEventSynchronize"); return e ? OK : INVALID_HANDLE; }

CUresult cuEventElapsedTime(float *ms, void *start, void *end) {
    ENTER("cuEventElapsedTime");
    struct event *a = start, *b = end;
    if (!a || !b || !a->recorded || !b->recorded) return INVALID_HANDLE;
    *ms = (float)((b->t - a->t) * 1e3);
    return OK;
}

CUresult cuEventDestroy_v2(void *e) {
    if (!e) return INVALID_HANDLE;
    free(e);
    events--;
    return OK;
}

CUresult cuModuleLoadData(void **m, const void *image) {
    ENTER("cuModuleLoadData");
    NEED_CONTEXT();
    const char *ptx = image;
    if (!strstr(ptx, ".version") || !strstr(ptx, ".entry vtax_empty()")) return INVALID_PTX;
    struct module *mod = malloc(sizeof *mod);
    mod->ctx = current;
    modules++;
    *m = mod;
    return OK;
}

CUresult cuModuleUnload(void *m) {
    if (!m) return INVALID_HANDLE;
    free(m);
    modules--;
    return OK;
}

CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    ENTER("cuModuleGetFunction");
    if (!m) return INVALID_HANDLE;
    if (strcmp(name, "vtax_empty") != 0) return NOT_FOUND;
    *f = m;
    return OK;
}

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, void *s, void **params,
                        void **extra) {
    ENTER("cuLaunchKernel");
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)params; (void)extra;
    CUresult r = check_stream(s);
    if (r) return r;
    if (!f || shared) return INVALID_VALUE;
    clock_s += kernel_s;
    return OK;
}

static const char *name_of(CUresult r) {
    switch (r) {
    case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case INVALID_PTX: return "CUDA_ERROR_INVALID_PTX";
    case INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case PEER_ACCESS_ALREADY_ENABLED: return "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED";
    default: return NULL;
    }
}

CUresult cuGetErrorName(CUresult r, const char **s) {
    *s = name_of(r);
    return *s ? OK : INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
    *s = r == OUT_OF_MEMORY ? "out of memory" : r == NO_DEVICE ? "no CUDA-capable device is detected"
                                                               : name_of(r) ? "fake error" : NULL;
    return *s ? OK : INVALID_VALUE;
}

__attribute__((destructor)) static void ledger(void) {
    const char *path = getenv("FAKE_CUDA_LEDGER");
    if (!path) return;
    FILE *f = fopen(path, "w");
    if (!f) return;
    long retained = 0;
    for (int i = 0; i < MAX_GPUS; i++) retained += contexts[i].refs;
    fprintf(f, "device_buffers=%ld host_buffers=%ld streams=%ld events=%ld modules=%ld contexts=%ld\n",
            device_buffers, host_buffers, streams, events, modules, retained);
    fclose(f);
}
