//! Whose work a GPU process is: its cgroup, from `/proc/<pid>/cgroup`, read
//! as a container, a Kubernetes pod or a Slurm job — so dashboards and the
//! detector name the workload, not a bare pid.

use std::collections::{HashMap, HashSet};

use super::super::cgroups::{classify, CONTAINER_SCOPE_PREFIXES};
use super::super::Roots;

/// The owner of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// `comm` of the process; empty when it is gone or in another PID namespace.
    pub command: String,
    /// Its cgroup path below the cgroup root; empty when unreadable.
    pub cgroup: String,
    /// What the cgroup holds (`container`, `pod`, `slurm_job`, … as the cgroups table says).
    pub workload: &'static str,
    /// Container id (first 12 hex digits, as `docker ps` shows it).
    pub container: String,
    /// Kubernetes pod UID.
    pub pod_uid: String,
    /// Slurm job id.
    pub slurm_job: String,
}

/// Owners of the pids seen, kept while their pids are: a process's cgroup is
/// read once, not every tick.
pub struct Owners {
    roots: Roots,
    known: HashMap<u32, Owner>,
    seen: HashSet<u32>,
}

impl Owners {
    /// Reads under `roots.procfs`.
    pub fn new(roots: &Roots) -> Owners {
        Owners {
            roots: roots.clone(),
            known: HashMap::new(),
            seen: HashSet::new(),
        }
    }

    /// Where processes are read from.
    pub fn procfs(&self) -> &std::path::Path {
        &self.roots.procfs
    }

    /// The owner of `pid`.
    pub fn of(&mut self, pid: u32) -> &Owner {
        let roots = &self.roots;
        self.seen.insert(pid);
        self.known.entry(pid).or_insert_with(|| {
            let dir = roots.proc(pid.to_string());
            let command = std::fs::read_to_string(dir.join("comm"))
                .map(|c| c.trim_end().to_string())
                .unwrap_or_default();
            let cgroup = std::fs::read_to_string(dir.join("cgroup"))
                .map(|text| cgroup_path(&text))
                .unwrap_or_default();
            owner_of(command, cgroup)
        })
    }

    /// Forgets the pids not asked about since the last call, so a reused
    /// pid is read afresh.
    pub fn retain_seen(&mut self) {
        let seen = std::mem::take(&mut self.seen);
        self.known.retain(|pid, _| seen.contains(pid));
    }
}

/// The path that places a process: the v1 memory hierarchy's when there is
/// one (on hybrid hosts the v2 line is often just `/`), else the v2 line's.
fn cgroup_path(text: &str) -> String {
    let mut unified = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = match (parts.next(), parts.next(), parts.next()) {
            (Some(id), Some(c), Some(p)) => (id, c, p),
            _ => continue,
        };
        if controllers.split(',').any(|c| c == "memory") {
            return path.to_string();
        }
        if controllers.is_empty() {
            unified = Some(path.to_string());
        }
    }
    unified.unwrap_or_default()
}

fn owner_of(command: String, cgroup: String) -> Owner {
    let mut owner = Owner {
        workload: if cgroup.is_empty() {
            "unknown"
        } else {
            classify(&cgroup)
        },
        command,
        ..Owner::default()
    };
    for part in cgroup.split('/') {
        if let Some(job) = part.strip_prefix("job_") {
            if !job.is_empty() && job.bytes().all(|b| b.is_ascii_digit()) {
                owner.slurm_job = job.to_string();
            }
        }
        // v2 systemd: kubepods-burstable-pod<uid with _>.slice; v1: pod<uid>.
        let pod = part
            .strip_suffix(".slice")
            .and_then(|s| s.rsplit_once("-pod").map(|(_, uid)| uid))
            .or_else(|| part.strip_prefix("pod"));
        if let Some(uid) = pod.filter(|u| u.len() >= 32) {
            owner.pod_uid = uid.replace('_', "-");
        }
        let scope = part.strip_suffix(".scope").unwrap_or(part);
        let id = CONTAINER_SCOPE_PREFIXES
            .iter()
            .find_map(|p| scope.strip_prefix(p))
            .unwrap_or(scope);
        if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            owner.container = id[..12].to_string();
        }
    }
    owner.cgroup = cgroup;
    owner
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD_CONTAINER: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c9a3d2e_5b1f_4c8e_9a6d_2f1e0b3c4d5a.slice/cri-containerd-8cf99c0bd8a71b2f1b068d6d096278cf4162dbf52d4986c27018e794a8d7befa.scope";

    #[test]
    fn a_kubernetes_container_names_its_pod_and_container() {
        let o = owner_of(
            "python3".into(),
            cgroup_path(&format!("0::{POD_CONTAINER}\n")),
        );
        assert_eq!(o.workload, "container");
        assert_eq!(o.pod_uid, "7c9a3d2e-5b1f-4c8e-9a6d-2f1e0b3c4d5a");
        assert_eq!(o.container, "8cf99c0bd8a7");
        assert_eq!(o.slurm_job, "");
    }

    #[test]
    fn a_slurm_step_on_v1_names_its_job_from_the_memory_line() {
        let text = "12:memory:/slurm/uid_1000/job_4242/step_0/task_0\n\
                    11:cpu,cpuacct:/slurm/uid_1000/job_4242/step_0\n\
                    1:name=systemd:/system.slice/slurmd.service\n0::/\n";
        let o = owner_of("train".into(), cgroup_path(text));
        assert_eq!(o.cgroup, "/slurm/uid_1000/job_4242/step_0/task_0");
        assert_eq!(o.slurm_job, "4242");
        assert_eq!(o.workload, "slurm_step");
    }

    #[test]
    fn a_v1_docker_container_and_an_unreadable_process() {
        let id = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
        let o = owner_of(
            String::new(),
            cgroup_path(&format!("4:memory:/docker/{id}\n")),
        );
        assert_eq!(o.container, "0f1e2d3c4b5a");
        assert_eq!(o.workload, "container");
        assert_eq!(
            owner_of(String::new(), cgroup_path("garbage")).workload,
            "unknown"
        );
    }
}
