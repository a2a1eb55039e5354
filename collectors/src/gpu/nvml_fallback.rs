//! Reads whose newest NVML entry point an older driver lacks, made through
//! the newest one the loaded driver has.
//!
//! nvml-wrapper calls only the newest form: `nvmlDeviceGetMemoryInfo_v2`
//! and `nvmlDeviceGetComputeRunningProcesses_v3`, both from R510. On an R470
//! node (still the driver of many V100 and A100 fleets) the memory read,
//! the first of every tick, would fail for every GPU, and the process list
//! would be empty with no word of why. Every driver still has the older
//! forms, so the fall back is to them, and `vtax doctor --gpu` says which
//! one a node uses ([`older_calls`]). The MPS clients' list
//! (`nvmlDeviceGetMPSComputeRunningProcesses_v3`) falls back the same way.

use std::os::raw::c_uint;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_t, nvmlProcessInfo_v1_t, nvmlProcessInfo_v2_t,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE as INSUFFICIENT_SIZE, nvmlReturn_t,
};

/// Whether `e` says the driver lacks the entry point: not in the library at
/// all, or there and answering FUNCTION_NOT_FOUND (as early R510 builds did
/// for the v2 memory call).
pub fn lacks_the_call(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound
    )
}

/// Device memory in use and in all, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    /// Allocated memory. Through the v1 call (drivers before R510) this
    /// includes what the driver reserves for itself, a few hundred MiB that
    /// the v2 call gives apart.
    pub used_bytes: u64,
    pub total_bytes: u64,
}

/// Device memory, through `nvmlDeviceGetMemoryInfo_v2` or, on a driver
/// without it, `nvmlDeviceGetMemoryInfo`.
pub fn memory(nvml: &Nvml, d: &Device<'_>) -> Result<Memory, NvmlError> {
    match d.memory_info() {
        Ok(m) => {
            return Ok(Memory {
                used_bytes: m.used,
                total_bytes: m.total,
            })
        }
        Err(e) if !lacks_the_call(&e) => return Err(e),
        Err(_) => {}
    }
    let get = *nvml_sym(nvml.lib().nvmlDeviceGetMemoryInfo.as_ref())?;
    let mut m = nvmlMemory_t {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: the handle is live while `d` is, and `m` is the v1 struct the
    // call fills.
    nvml_try(unsafe { get(d.handle(), &mut m) })?;
    Ok(Memory {
        used_bytes: m.used,
        total_bytes: m.total,
    })
}

/// Which of NVML's process lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessList {
    /// Processes with a compute context of their own.
    Compute,
    /// The clients of an MPS server, which has the one compute context
    /// they share: the compute list names only the server.
    Mps,
}

/// An older list call: the device, the count in and out, the array.
type ListCall<T> = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut T) -> nvmlReturn_t;

/// The processes of `list` on the GPU, through the newest of its `_v3`
/// (R510), `_v2` and unversioned (no GPU instance ids) calls that the
/// driver has.
pub fn processes(
    nvml: &Nvml,
    d: &Device<'_>,
    list: ProcessList,
) -> Result<Vec<ProcessInfo>, NvmlError> {
    let newest = match list {
        ProcessList::Compute => d.running_compute_processes(),
        ProcessList::Mps => d.mps_running_compute_processes(),
    };
    match newest {
        Err(e) if lacks_the_call(&e) => {}
        listed => return listed,
    }
    let lib = nvml.lib();
    let (v2, v1) = match list {
        ProcessList::Compute => (
            &lib.nvmlDeviceGetComputeRunningProcesses_v2,
            &lib.nvmlDeviceGetComputeRunningProcesses,
        ),
        ProcessList::Mps => (
            &lib.nvmlDeviceGetMPSComputeRunningProcesses_v2,
            &lib.nvmlDeviceGetMPSComputeRunningProcesses,
        ),
    };
    if let Ok(get) = v2 {
        let empty = nvmlProcessInfo_v2_t {
            pid: 0,
            usedGpuMemory: 0,
            gpuInstanceId: 0,
            computeInstanceId: 0,
        };
        match list_through(d, *get, empty, ProcessInfo::from) {
            Err(e) if lacks_the_call(&e) => {}
            listed => return listed,
        }
    }
    let empty = nvmlProcessInfo_v1_t {
        pid: 0,
        usedGpuMemory: 0,
    };
    list_through(d, *nvml_sym(v1.as_ref())?, empty, |p| ProcessInfo {
        pid: p.pid,
        used_gpu_memory: UsedGpuMemory::from(p.usedGpuMemory),
        gpu_instance_id: None,
        compute_instance_id: None,
    })
}

/// The list an older call gives: the count first, then room for a few
/// more, in case processes start between the two calls.
fn list_through<T: Copy>(
    d: &Device<'_>,
    get: ListCall<T>,
    empty: T,
    info: impl Fn(T) -> ProcessInfo,
) -> Result<Vec<ProcessInfo>, NvmlError> {
    let mut count: c_uint = 0;
    // SAFETY: the handle is live while `d` is; a null array with a count
    // of 0 asks only for the count.
    match unsafe { get(d.handle(), &mut count, std::ptr::null_mut()) } {
        INSUFFICIENT_SIZE => {}
        status => {
            nvml_try(status)?;
            return Ok(Vec::new());
        }
    }
    count += 5;
    let mut infos = vec![empty; count as usize];
    // SAFETY: `infos` holds `count` structs of the call's version to fill.
    nvml_try(unsafe { get(d.handle(), &mut count, infos.as_mut_ptr()) })?;
    infos.truncate(count as usize);
    Ok(infos.into_iter().map(info).collect())
}

/// A line for each read that the loaded driver serves through an older
/// call than nvml-wrapper's, with what that changes; none on a current
/// driver.
pub fn older_calls(nvml: &Nvml) -> Vec<String> {
    let lib = nvml.lib();
    let mut lines = Vec::new();
    if lib.nvmlDeviceGetMemoryInfo_v2.is_err() {
        lines.push(
            "memory through nvmlDeviceGetMemoryInfo (the driver predates the v2 call, R510): \
             used memory includes what the driver reserves for itself"
                .to_string(),
        );
    }
    if lib.nvmlDeviceGetComputeRunningProcesses_v3.is_err() {
        lines.push(
            if lib.nvmlDeviceGetComputeRunningProcesses_v2.is_ok() {
                "processes through nvmlDeviceGetComputeRunningProcesses_v2 (the driver predates \
                 the v3 call, R510)"
            } else if lib.nvmlDeviceGetComputeRunningProcesses.is_ok() {
                "processes through nvmlDeviceGetComputeRunningProcesses (the driver predates \
                 MIG, R450): no GPU instance ids"
            } else {
                "processes not listed: the driver has no nvmlDeviceGetComputeRunningProcesses call"
            }
            .to_string(),
        );
    }
    if lib.nvmlDeviceGetMPSComputeRunningProcesses_v3.is_err()
        && lib.nvmlDeviceGetMPSComputeRunningProcesses_v2.is_err()
        && lib.nvmlDeviceGetMPSComputeRunningProcesses.is_err()
    {
        lines.push(
            "MPS clients not listed: the driver has no nvmlDeviceGetMPSComputeRunningProcesses \
             call, so under MPS only the server shows"
                .to_string(),
        );
    }
    lines
}
