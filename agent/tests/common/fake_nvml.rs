//! The fake NVML (`fake_nvml/libnvidia-ml.c`), compiled with `cc` into a
//! directory of its own, with the state file it reads and the log of calls
//! it writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct FakeNvml {
    dir: tempfile::TempDir,
    state: PathBuf,
    calls: PathBuf,
}

/// One call the agent made, as the fake logged it.
#[derive(Clone, Debug)]
pub struct Call {
    pub at_us: i64,
    /// NVML's index of the GPU the call was for; -1 for none.
    pub gpu: i32,
    /// The calling thread's id.
    pub thread: i64,
    pub name: String,
}

/// Which driver branch the fake's entry points are those of.
#[derive(Clone, Copy, PartialEq)]
pub enum Driver {
    Current,
    /// No GPM, and only the older memory and process-list calls.
    R470,
    /// R470's lacks, and no MIG, GPU instance ids, remapped rows or v2
    /// process list either.
    R418,
}

impl FakeNvml {
    /// The fake compiled, with `state` as its state file (see the C source
    /// for the keys).
    pub fn new(driver: Driver, state: &str) -> FakeNvml {
        let dir = tempfile::tempdir().unwrap();
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_nvml/libnvidia-ml.c");
        let mut cc = Command::new("cc");
        cc.args(["-shared", "-fPIC", "-O1", "-pthread", "-o"])
            .arg(dir.path().join("libnvidia-ml.so.1"))
            .arg(&source);
        match driver {
            Driver::Current => {}
            Driver::R470 => {
                cc.arg("-DFAKE_NVML_R470");
            }
            Driver::R418 => {
                cc.arg("-DFAKE_NVML_R418");
            }
        }
        let out = cc.output().expect("cc runs");
        assert!(
            out.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fake = FakeNvml {
            state: dir.path().join("state"),
            calls: dir.path().join("calls"),
            dir,
        };
        fake.set(state);
        fake
    }

    /// The directory the library is in (another fake library may join it).
    pub fn lib_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Names the library's file as a driver's install names it,
    /// libnvidia-ml.so.<version>, with libnvidia-ml.so.1 a link to it.
    pub fn name_library_version(&self, version: &str) {
        let dir = self.dir.path();
        let file = format!("libnvidia-ml.so.{version}");
        std::fs::rename(dir.join("libnvidia-ml.so.1"), dir.join(&file)).unwrap();
        std::os::unix::fs::symlink(&file, dir.join("libnvidia-ml.so.1")).unwrap();
    }

    /// The environment that puts the fake in front of any real NVML.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("LD_LIBRARY_PATH", self.dir.path().display().to_string()),
            ("FAKE_NVML_STATE", self.state.display().to_string()),
            ("FAKE_NVML_CALLS", self.calls.display().to_string()),
        ]
    }

    /// Replaces the state at once (a rename, so no call reads half a file).
    pub fn set(&self, state: &str) {
        let next = self.dir.path().join("state.next");
        std::fs::write(&next, state).unwrap();
        std::fs::rename(&next, &self.state).unwrap();
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        let text = std::fs::read_to_string(&self.calls).unwrap_or_default();
        text.lines()
            .filter_map(|line| {
                let mut words = line.split(' ');
                Some(Call {
                    at_us: words.next()?.parse().ok()?,
                    gpu: words.next()?.parse().ok()?,
                    thread: words.next()?.parse().ok()?,
                    name: words.next()?.to_string(),
                })
            })
            .collect()
    }

    /// Each sample of `gpu`: the calls of the collector's thread from one
    /// `nvmlDeviceGetHandleByIndex_v2` to the next, where they read its
    /// memory, by either call (the first read of every sample; finding the
    /// GPUs does not).
    pub fn ticks(&self, gpu: i32) -> Vec<Tick> {
        let calls = self.calls();
        // The XID thread is the one that made the event set.
        let xid_thread = calls
            .iter()
            .find(|c| c.name == "nvmlEventSetCreate")
            .map(|c| c.thread);
        let mut ticks: Vec<Tick> = Vec::new();
        for call in calls
            .into_iter()
            .filter(|c| c.gpu == gpu && Some(c.thread) != xid_thread)
        {
            if call.name == "nvmlDeviceGetHandleByIndex_v2" {
                ticks.push(Tick {
                    at_us: call.at_us,
                    calls: BTreeMap::new(),
                });
            }
            if let Some(tick) = ticks.last_mut() {
                *tick.calls.entry(call.name).or_default() += 1;
            }
        }
        ticks.retain(|t| t.made("nvmlDeviceGetMemoryInfo_v2") || t.made("nvmlDeviceGetMemoryInfo"));
        ticks
    }
}

/// One sample of one GPU: when it began and how often it called each entry point.
#[derive(Debug)]
pub struct Tick {
    pub at_us: i64,
    pub calls: BTreeMap<String, u32>,
}

impl Tick {
    pub fn made(&self, call: &str) -> bool {
        self.calls.contains_key(call)
    }
}
