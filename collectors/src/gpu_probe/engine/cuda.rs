//! The probe's CUDA engine: the driver API (`libcuda.so.1`) loaded at run
//! time through `libloading`, only the entry points used declared. No CUDA
//! toolkit at build time; the empty kernel is PTX text the driver compiles.
//!
//! Each resource (primary context, stream, event, buffers, module) is held
//! by a guard that frees it when dropped, on every path, errors included.
//! Names are the symbols the driver exports: `cuda.h` maps `cuMemAlloc` to
//! `cuMemAlloc_v2` and so on, and those are what a program built against
//! the header calls; the legacy default stream is never used, so none of the
//! per-thread (`_ptsz`) variants is needed.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;
use std::time::Instant;

use super::{median, CudaGpu, Engine, GpuFigures, PeerOutcome, ProbeError, Sizes};

type CuResult = c_int;
type CuDevice = c_int;
type CuDevicePtr = u64;
type CuContext = *mut c_void;
type CuStream = *mut c_void;
type CuEvent = *mut c_void;
type CuModule = *mut c_void;
type CuFunction = *mut c_void;

const CUDA_SUCCESS: CuResult = 0;
/// `cuCtxEnablePeerAccess` on a pair already enabled: not an error here.
const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CuResult = 704;
/// A stream that does not synchronise with the legacy default stream.
const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// Events that time (no flag): `CU_EVENT_DEFAULT`.
const CU_EVENT_DEFAULT: c_uint = 0;

/// The empty kernel. PTX ISA 7.0 (CUDA 11.0 drivers and newer) for sm_50,
/// which every driver since then compiles for whatever GPU it has.
const EMPTY_KERNEL_PTX: &CStr = c"
.version 7.0
.target sm_50
.address_size 64

.visible .entry vtax_empty()
{
    ret;
}
";
const EMPTY_KERNEL_NAME: &CStr = c"vtax_empty";

/// The driver's entry points.
struct Api {
    cu_init: unsafe extern "C" fn(c_uint) -> CuResult,
    cu_device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    cu_device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    cu_device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    cu_device_get_pci_bus_id: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    cu_device_primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    cu_device_primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    cu_ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    cu_mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    cu_mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    cu_mem_alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> CuResult,
    cu_mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    cu_memcpy_htod_async:
        unsafe extern "C" fn(CuDevicePtr, *const c_void, usize, CuStream) -> CuResult,
    cu_memcpy_dtoh_async:
        unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, CuStream) -> CuResult,
    cu_memcpy_dtod_async:
        unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize, CuStream) -> CuResult,
    cu_memcpy_peer_async: unsafe extern "C" fn(
        CuDevicePtr,
        CuContext,
        CuDevicePtr,
        CuContext,
        usize,
        CuStream,
    ) -> CuResult,
    cu_device_can_access_peer: unsafe extern "C" fn(*mut c_int, CuDevice, CuDevice) -> CuResult,
    cu_ctx_enable_peer_access: unsafe extern "C" fn(CuContext, c_uint) -> CuResult,
    cu_stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    cu_stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    cu_stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    cu_event_create: unsafe extern "C" fn(*mut CuEvent, c_uint) -> CuResult,
    cu_event_record: unsafe extern "C" fn(CuEvent, CuStream) -> CuResult,
    cu_event_synchronize: unsafe extern "C" fn(CuEvent) -> CuResult,
    cu_event_elapsed_time: unsafe extern "C" fn(*mut f32, CuEvent, CuEvent) -> CuResult,
    cu_event_destroy: unsafe extern "C" fn(CuEvent) -> CuResult,
    cu_module_load_data: unsafe extern "C" fn(*mut CuModule, *const c_void) -> CuResult,
    cu_module_unload: unsafe extern "C" fn(CuModule) -> CuResult,
    cu_module_get_function:
        unsafe extern "C" fn(*mut CuFunction, CuModule, *const c_char) -> CuResult,
    #[allow(clippy::type_complexity)]
    cu_launch_kernel: unsafe extern "C" fn(
        CuFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        CuStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    cu_get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    cu_get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    /// Keeps the entry points above valid.
    _lib: libloading::Library,
}

/// One entry point of the library, copied out as a plain function pointer.
///
/// # Safety
/// `T` must be the symbol's true type.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, ProbeError> {
    // SAFETY: the caller names the type; the pointer is used only while `lib` lives (in `Api`).
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| ProbeError::NoDriver(format!("libcuda.so.1 lacks {name} ({e})")))
}

impl Api {
    fn load() -> Result<Api, ProbeError> {
        // SAFETY: loading the driver runs its initialisers, which are meant to run in any process.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }
            .map_err(|e| ProbeError::NoDriver(format!("libcuda.so.1 could not be loaded ({e})")))?;
        // SAFETY: each type below is the entry point's signature in cuda.h.
        unsafe {
            Ok(Api {
                cu_init: symbol(&lib, "cuInit")?,
                cu_device_get_count: symbol(&lib, "cuDeviceGetCount")?,
                cu_device_get: symbol(&lib, "cuDeviceGet")?,
                cu_device_get_name: symbol(&lib, "cuDeviceGetName")?,
                cu_device_get_pci_bus_id: symbol(&lib, "cuDeviceGetPCIBusId")?,
                cu_device_primary_ctx_retain: symbol(&lib, "cuDevicePrimaryCtxRetain")?,
                cu_device_primary_ctx_release: symbol(&lib, "cuDevicePrimaryCtxRelease_v2")?,
                cu_ctx_set_current: symbol(&lib, "cuCtxSetCurrent")?,
                cu_mem_alloc: symbol(&lib, "cuMemAlloc_v2")?,
                cu_mem_free: symbol(&lib, "cuMemFree_v2")?,
                cu_mem_alloc_host: symbol(&lib, "cuMemAllocHost_v2")?,
                cu_mem_free_host: symbol(&lib, "cuMemFreeHost")?,
                cu_memcpy_htod_async: symbol(&lib, "cuMemcpyHtoDAsync_v2")?,
                cu_memcpy_dtoh_async: symbol(&lib, "cuMemcpyDtoHAsync_v2")?,
                cu_memcpy_dtod_async: symbol(&lib, "cuMemcpyDtoDAsync_v2")?,
                cu_memcpy_peer_async: symbol(&lib, "cuMemcpyPeerAsync")?,
                cu_device_can_access_peer: symbol(&lib, "cuDeviceCanAccessPeer")?,
                cu_ctx_enable_peer_access: symbol(&lib, "cuCtxEnablePeerAccess")?,
                cu_stream_create: symbol(&lib, "cuStreamCreate")?,
                cu_stream_synchronize: symbol(&lib, "cuStreamSynchronize")?,
                cu_stream_destroy: symbol(&lib, "cuStreamDestroy_v2")?,
                cu_event_create: symbol(&lib, "cuEventCreate")?,
                cu_event_record: symbol(&lib, "cuEventRecord")?,
                cu_event_synchronize: symbol(&lib, "cuEventSynchronize")?,
                cu_event_elapsed_time: symbol(&lib, "cuEventElapsedTime")?,
                cu_event_destroy: symbol(&lib, "cuEventDestroy_v2")?,
                cu_module_load_data: symbol(&lib, "cuModuleLoadData")?,
                cu_module_unload: symbol(&lib, "cuModuleUnload")?,
                cu_module_get_function: symbol(&lib, "cuModuleGetFunction")?,
                cu_launch_kernel: symbol(&lib, "cuLaunchKernel")?,
                cu_get_error_name: symbol(&lib, "cuGetErrorName")?,
                cu_get_error_string: symbol(&lib, "cuGetErrorString")?,
                _lib: lib,
            })
        }
    }

    /// Turns a call's result into an error naming the call and the driver's error.
    fn check(&self, call: &'static str, result: CuResult) -> Result<(), ProbeError> {
        if result == CUDA_SUCCESS {
            return Ok(());
        }
        let text = |f: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult| {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: the driver writes a pointer to a static string, or fails.
            let ok = unsafe { f(result, &mut p) } == CUDA_SUCCESS && !p.is_null();
            // SAFETY: a non-null pointer from the driver is a NUL-terminated static string.
            ok.then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        Err(ProbeError::Call {
            call,
            name: text(self.cu_get_error_name).unwrap_or_else(|| format!("CUresult {result}")),
            description: text(self.cu_get_error_string).unwrap_or_else(|| "no description".into()),
        })
    }
}

/// A retained primary context, released when dropped.
struct PrimaryContext<'a> {
    api: &'a Api,
    device: CuDevice,
    ctx: CuContext,
}

impl<'a> PrimaryContext<'a> {
    fn retain(api: &'a Api, device: CuDevice) -> Result<Self, ProbeError> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the device came from cuDeviceGet.
        api.check("cuDevicePrimaryCtxRetain", unsafe {
            (api.cu_device_primary_ctx_retain)(&mut ctx, device)
        })?;
        Ok(PrimaryContext { api, device, ctx })
    }

    fn make_current(&self) -> Result<(), ProbeError> {
        // SAFETY: ctx is retained for as long as self lives.
        self.api.check("cuCtxSetCurrent", unsafe {
            (self.api.cu_ctx_set_current)(self.ctx)
        })
    }
}

impl Drop for PrimaryContext<'_> {
    fn drop(&mut self) {
        // SAFETY: unsetting first so no thread state points at a context being released.
        unsafe {
            (self.api.cu_ctx_set_current)(std::ptr::null_mut());
            (self.api.cu_device_primary_ctx_release)(self.device);
        }
    }
}

/// Device memory, freed when dropped.
struct DeviceBuffer<'a> {
    api: &'a Api,
    ptr: CuDevicePtr,
}

impl<'a> DeviceBuffer<'a> {
    /// Allocates in the current context.
    fn new(api: &'a Api, bytes: usize) -> Result<Self, ProbeError> {
        let mut ptr = 0;
        // SAFETY: valid out-pointer.
        api.check("cuMemAlloc_v2", unsafe {
            (api.cu_mem_alloc)(&mut ptr, bytes)
        })?;
        Ok(DeviceBuffer { api, ptr })
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuMemAlloc_v2 and is freed once; with unified
        // addressing it is freed whatever context is current.
        unsafe { (self.api.cu_mem_free)(self.ptr) };
    }
}

/// Pinned (page-locked) host memory, freed when dropped.
struct HostBuffer<'a> {
    api: &'a Api,
    ptr: *mut c_void,
}

impl<'a> HostBuffer<'a> {
    fn new(api: &'a Api, bytes: usize) -> Result<Self, ProbeError> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        api.check("cuMemAllocHost_v2", unsafe {
            (api.cu_mem_alloc_host)(&mut ptr, bytes)
        })?;
        Ok(HostBuffer { api, ptr })
    }
}

impl Drop for HostBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuMemAllocHost_v2 and is freed once.
        unsafe { (self.api.cu_mem_free_host)(self.ptr) };
    }
}

/// A non-blocking stream of the current context, destroyed when dropped.
struct Stream<'a> {
    api: &'a Api,
    stream: CuStream,
}

impl<'a> Stream<'a> {
    fn new(api: &'a Api) -> Result<Self, ProbeError> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        api.check("cuStreamCreate", unsafe {
            (api.cu_stream_create)(&mut stream, CU_STREAM_NON_BLOCKING)
        })?;
        Ok(Stream { api, stream })
    }

    fn synchronize(&self) -> Result<(), ProbeError> {
        // SAFETY: a live stream.
        self.api.check("cuStreamSynchronize", unsafe {
            (self.api.cu_stream_synchronize)(self.stream)
        })
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        // SAFETY: destroyed once; work still queued completes first.
        unsafe { (self.api.cu_stream_destroy)(self.stream) };
    }
}

/// A timing event, destroyed when dropped.
struct Event<'a> {
    api: &'a Api,
    event: CuEvent,
}

impl<'a> Event<'a> {
    fn new(api: &'a Api) -> Result<Self, ProbeError> {
        let mut event = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        api.check("cuEventCreate", unsafe {
            (api.cu_event_create)(&mut event, CU_EVENT_DEFAULT)
        })?;
        Ok(Event { api, event })
    }

    fn record(&self, stream: &Stream) -> Result<(), ProbeError> {
        // SAFETY: a live event and stream of the same context.
        self.api.check("cuEventRecord", unsafe {
            (self.api.cu_event_record)(self.event, stream.stream)
        })
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        // SAFETY: destroyed once.
        unsafe { (self.api.cu_event_destroy)(self.event) };
    }
}

/// A loaded module, unloaded when dropped.
struct Module<'a> {
    api: &'a Api,
    module: CuModule,
}

impl Drop for Module<'_> {
    fn drop(&mut self) {
        // SAFETY: unloaded once.
        unsafe { (self.api.cu_module_unload)(self.module) };
    }
}

/// A start and an end event on one stream: the timer of every interval.
struct Timer<'a> {
    api: &'a Api,
    start: Event<'a>,
    end: Event<'a>,
    /// Sum of every interval timed.
    busy_seconds: f64,
}

impl<'a> Timer<'a> {
    fn new(api: &'a Api) -> Result<Self, ProbeError> {
        Ok(Timer {
            api,
            start: Event::new(api)?,
            end: Event::new(api)?,
            busy_seconds: 0.0,
        })
    }

    /// Times `work` on `stream` between the two events, waits for it, and
    /// returns its seconds.
    fn time(
        &mut self,
        stream: &Stream,
        work: impl FnOnce() -> Result<(), ProbeError>,
    ) -> Result<f64, ProbeError> {
        self.start.record(stream)?;
        work()?;
        self.end.record(stream)?;
        // SAFETY: a live, recorded event.
        self.api.check("cuEventSynchronize", unsafe {
            (self.api.cu_event_synchronize)(self.end.event)
        })?;
        let mut ms = 0f32;
        // SAFETY: both events recorded and complete.
        self.api.check("cuEventElapsedTime", unsafe {
            (self.api.cu_event_elapsed_time)(&mut ms, self.start.event, self.end.event)
        })?;
        let seconds = f64::from(ms) / 1e3;
        self.busy_seconds += seconds;
        Ok(seconds)
    }

    /// `warmup` uncounted then `repeats` counted intervals of `work`; the
    /// median of the counted ones.
    fn median(
        &mut self,
        stream: &Stream,
        warmup: u32,
        repeats: u32,
        mut work: impl FnMut() -> Result<(), ProbeError>,
    ) -> Result<f64, ProbeError> {
        let mut times = Vec::with_capacity(repeats as usize);
        for i in 0..warmup + repeats {
            let t = self.time(stream, &mut work)?;
            if i >= warmup {
                times.push(t);
            }
        }
        median(&times).ok_or_else(|| ProbeError::Other("no repetitions asked for".into()))
    }
}

/// Host-timed median of `repeats` runs of `work` after `warmup` uncounted ones.
fn host_median(
    warmup: u32,
    repeats: u32,
    mut work: impl FnMut() -> Result<(), ProbeError>,
) -> Result<f64, ProbeError> {
    let mut times = Vec::with_capacity(repeats as usize);
    for i in 0..warmup + repeats {
        let t = Instant::now();
        work()?;
        if i >= warmup {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    median(&times).ok_or_else(|| ProbeError::Other("no repetitions asked for".into()))
}

/// The driver, loaded and initialised once for the process (as NVML is):
/// unloading a driver library is never safe while anything may hold its handles.
static API: OnceLock<Result<&'static Api, ProbeError>> = OnceLock::new();

fn api() -> Result<&'static Api, ProbeError> {
    API.get_or_init(|| {
        let api = Api::load()?;
        // SAFETY: flags must be 0.
        api.check("cuInit", unsafe { (api.cu_init)(0) })?;
        Ok(&*Box::leak(Box::new(api)))
    })
    .clone()
}

/// The CUDA driver as the probe's [`Engine`].
///
/// Each GPU's primary context is retained at its first use and released
/// when the engine is dropped: creating a context costs a tenth of a second
/// or more, once per GPU rather than once per pair. A context holds some
/// hundreds of MiB of GPU memory, so a caller that probes now and then
/// drops the engine between probes.
pub struct CudaEngine {
    api: &'static Api,
    /// Driver device handle of each ordinal.
    devices: HashMap<u32, CuDevice>,
    /// Retained primary contexts, by ordinal.
    contexts: HashMap<u32, PrimaryContext<'static>>,
}

impl CudaEngine {
    /// Loads and initialises the driver (once per process).
    pub fn new() -> Result<CudaEngine, ProbeError> {
        Ok(CudaEngine {
            api: api()?,
            devices: HashMap::new(),
            contexts: HashMap::new(),
        })
    }

    /// The GPU's primary context, retained once.
    fn context(&mut self, ordinal: u32) -> Result<&PrimaryContext<'static>, ProbeError> {
        let device = self.device(ordinal)?;
        if !self.contexts.contains_key(&ordinal) {
            let ctx = PrimaryContext::retain(self.api, device)?;
            self.contexts.insert(ordinal, ctx);
        }
        Ok(&self.contexts[&ordinal])
    }

    fn count(&self) -> Result<c_int, ProbeError> {
        let mut count = 0;
        // SAFETY: valid out-pointer.
        self.api.check("cuDeviceGetCount", unsafe {
            (self.api.cu_device_get_count)(&mut count)
        })?;
        Ok(count)
    }

    fn device(&mut self, ordinal: u32) -> Result<CuDevice, ProbeError> {
        if let Some(d) = self.devices.get(&ordinal) {
            return Ok(*d);
        }
        let count = self.count()?;
        if i64::from(ordinal) >= i64::from(count) {
            return Err(ProbeError::Other(format!(
                "no GPU {ordinal}: the driver lists {count}"
            )));
        }
        let mut device = 0;
        // SAFETY: valid out-pointer, ordinal below the count.
        self.api.check("cuDeviceGet", unsafe {
            (self.api.cu_device_get)(&mut device, ordinal as c_int)
        })?;
        self.devices.insert(ordinal, device);
        Ok(device)
    }

    fn text(
        &self,
        call: &'static str,
        f: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
        device: CuDevice,
    ) -> Result<String, ProbeError> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the driver writes at most len bytes, NUL-terminated.
        self.api.check(call, unsafe {
            f(buf.as_mut_ptr(), buf.len() as c_int, device)
        })?;
        // SAFETY: NUL-terminated within the buffer.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }
}

fn copy_size(sizes: &Sizes) -> Result<usize, ProbeError> {
    usize::try_from(sizes.copy_bytes)
        .ok()
        .filter(|b| *b > 0)
        .ok_or_else(|| ProbeError::Other(format!("bad copy size {}", sizes.copy_bytes)))
}

impl Engine for CudaEngine {
    fn gpus(&mut self) -> Result<Vec<CudaGpu>, ProbeError> {
        let count = self.count()?;
        let mut gpus = Vec::new();
        for ordinal in 0..count.max(0) as u32 {
            let device = self.device(ordinal)?;
            let name = self.text("cuDeviceGetName", self.api.cu_device_get_name, device)?;
            let bus = self.text(
                "cuDeviceGetPCIBusId",
                self.api.cu_device_get_pci_bus_id,
                device,
            )?;
            gpus.push(CudaGpu {
                ordinal,
                name,
                pci_bus_id: super::facts::normalise_bus_id(&bus).unwrap_or(bus),
            });
        }
        Ok(gpus)
    }

    fn measure(&mut self, ordinal: u32, sizes: &Sizes) -> Result<GpuFigures, ProbeError> {
        let bytes = copy_size(sizes)?;
        let api = self.api;
        self.context(ordinal)?.make_current()?;
        let stream = Stream::new(api)?;
        let mut timer = Timer::new(api)?;
        let host = HostBuffer::new(api, bytes)?;
        let a = DeviceBuffer::new(api, bytes)?;
        let b = DeviceBuffer::new(api, bytes)?;
        let (s, w, r) = (stream.stream, sizes.warmup, sizes.repeats);

        // SAFETY (each copy): live buffers of `bytes` bytes, a live stream.
        let h2d = timer.median(&stream, w, r, || {
            api.check("cuMemcpyHtoDAsync_v2", unsafe {
                (api.cu_memcpy_htod_async)(a.ptr, host.ptr, bytes, s)
            })
        })?;
        let d2h = timer.median(&stream, w, r, || {
            api.check("cuMemcpyDtoHAsync_v2", unsafe {
                (api.cu_memcpy_dtoh_async)(host.ptr, a.ptr, bytes, s)
            })
        })?;
        let d2d = timer.median(&stream, w, r, || {
            api.check("cuMemcpyDtoDAsync_v2", unsafe {
                (api.cu_memcpy_dtod_async)(b.ptr, a.ptr, bytes, s)
            })
        })?;

        let small = SmallCopy::new(api)?;
        let lw = sizes.warmup.max(1) * 10;
        let round_trip = host_median(lw, sizes.latency_repeats, || {
            small.round_trip(a.ptr, &stream)
        })?;

        let mut module = std::ptr::null_mut();
        // SAFETY: NUL-terminated PTX text.
        api.check("cuModuleLoadData", unsafe {
            (api.cu_module_load_data)(&mut module, EMPTY_KERNEL_PTX.as_ptr().cast())
        })?;
        let module = Module { api, module };
        let mut kernel = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        api.check("cuModuleGetFunction", unsafe {
            (api.cu_module_get_function)(&mut kernel, module.module, EMPTY_KERNEL_NAME.as_ptr())
        })?;
        let launch = || {
            // SAFETY: a kernel of no parameters, one thread.
            api.check("cuLaunchKernel", unsafe {
                (api.cu_launch_kernel)(
                    kernel,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    s,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            })
        };
        let launch_host = host_median(lw, sizes.latency_repeats, || {
            launch()?;
            stream.synchronize()
        })?;
        let launch_event = timer.median(&stream, lw, sizes.latency_repeats, launch)?;

        Ok(GpuFigures {
            host_to_device_bytes_per_second: bytes as f64 / h2d,
            device_to_host_bytes_per_second: bytes as f64 / d2h,
            small_copy_round_trip_seconds: round_trip,
            kernel_launch_seconds: launch_host,
            kernel_launch_event_seconds: launch_event,
            device_to_device_bytes_per_second: 2.0 * bytes as f64 / d2d,
            gpu_busy_seconds: timer.busy_seconds,
        })
        // Dropped in reverse order: module, buffers, events, stream.
    }

    fn measure_peer(
        &mut self,
        src: u32,
        dst: u32,
        sizes: &Sizes,
    ) -> Result<PeerOutcome, ProbeError> {
        let bytes = copy_size(sizes)?;
        let (src_dev, dst_dev) = (self.device(src)?, self.device(dst)?);
        let api = self.api;
        let can = |a: CuDevice, b: CuDevice| {
            let mut can = 0;
            // SAFETY: valid out-pointer, two devices from cuDeviceGet.
            api.check("cuDeviceCanAccessPeer", unsafe {
                (api.cu_device_can_access_peer)(&mut can, a, b)
            })
            .map(|()| can != 0)
        };
        if !can(src_dev, dst_dev)? || !can(dst_dev, src_dev)? {
            return Ok(PeerOutcome::NoPeerAccess);
        }
        self.context(src)?;
        self.context(dst)?;
        let (src_ctx, dst_ctx) = (&self.contexts[&src], &self.contexts[&dst]);
        let enable = |from: &PrimaryContext, to: &PrimaryContext| {
            from.make_current()?;
            // SAFETY: two retained contexts; flags must be 0.
            match unsafe { (api.cu_ctx_enable_peer_access)(to.ctx, 0) } {
                CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
                r => api.check("cuCtxEnablePeerAccess", r),
            }
        };
        enable(dst_ctx, src_ctx)?;
        let to = DeviceBuffer::new(api, bytes)?;
        enable(src_ctx, dst_ctx)?;
        let from = DeviceBuffer::new(api, bytes)?;
        // The copy runs on the source GPU's stream, as PyTorch runs a copy between GPUs.
        let stream = Stream::new(api)?;
        let mut timer = Timer::new(api)?;
        let s = stream.stream;
        let t = timer.median(&stream, sizes.warmup, sizes.repeats, || {
            // SAFETY: live buffers of `bytes` bytes in two retained contexts, a live stream.
            api.check("cuMemcpyPeerAsync", unsafe {
                (api.cu_memcpy_peer_async)(to.ptr, dst_ctx.ctx, from.ptr, src_ctx.ctx, bytes, s)
            })
        })?;
        Ok(PeerOutcome::Measured {
            bytes_per_second: bytes as f64 / t,
            gpu_busy_seconds: timer.busy_seconds,
        })
    }
}

/// The 4-byte round trip's pinned host word.
struct SmallCopy<'a> {
    api: &'a Api,
    host: HostBuffer<'a>,
}

impl<'a> SmallCopy<'a> {
    fn new(api: &'a Api) -> Result<Self, ProbeError> {
        Ok(SmallCopy {
            api,
            host: HostBuffer::new(api, super::SMALL_COPY_BYTES as usize)?,
        })
    }

    /// 4 bytes to `device` and back, then waits for both.
    fn round_trip(&self, device: CuDevicePtr, stream: &Stream) -> Result<(), ProbeError> {
        let (api, n) = (self.api, super::SMALL_COPY_BYTES as usize);
        // SAFETY: a live pinned buffer of n bytes, a device buffer larger than n, a live stream.
        api.check("cuMemcpyHtoDAsync_v2", unsafe {
            (api.cu_memcpy_htod_async)(device, self.host.ptr, n, stream.stream)
        })?;
        // SAFETY: as above.
        api.check("cuMemcpyDtoHAsync_v2", unsafe {
            (api.cu_memcpy_dtoh_async)(self.host.ptr, device, n, stream.stream)
        })?;
        stream.synchronize()
    }
}
