//! The collector: walks the HCAs when they change, then reads every
//! port's files each tick into its rows.

use super::*;

/// The infiniband collector.
pub struct Infiniband {
    pub(super) class_dir: PathBuf,
    pub(super) hw_counters: bool,
    pub(super) devices_wanted: Vec<String>,
    /// Sorted entries of `class_dir` at the last walk; `None` when it was absent.
    pub(super) listed: Option<Vec<OsString>>,
    pub(super) devices: Vec<Device>,
    pub(super) stale: bool,
    pub(super) ticks: u64,
    pub(super) buf: Vec<u8>,
    pub(super) listing: Vec<OsString>,
    pub(super) port_rows: BatchBuilder,
    pub(super) link_rows: BatchBuilder,
    pub(super) device_rows: BatchBuilder,
    pub(super) hw_rows: BatchBuilder,
    pub(super) hw_values: Vec<Option<u64>>,
    pub(super) seen: Vec<PortSeen>,
    pub(super) problems: Vec<String>,
    /// Files that read badly at the last walk (link layer, LID, HCA identity,
    /// a `ports/` or `hw_counters/` listing), named again at every tick.
    pub(super) walk_errors: Vec<ParseError>,
    /// Files that read badly at the last tick, the walk's included: each
    /// costs only its own value (or its device), not the other ports'.
    pub(super) errors: Vec<ParseError>,
    /// Where the PCI bus is seen.
    pub(super) sysfs: PathBuf,
    /// The InfiniBand controllers on the PCI bus that the kernel made no
    /// RDMA device of, found when the device list changes: named at every
    /// tick as sources that read badly.
    pub(super) controllers_without_device: Vec<ParseError>,
    /// Whether the bus has been read since the device list last changed.
    pub(super) bus_read: bool,
}

impl Infiniband {
    /// An infiniband collector reading under `roots`.
    pub fn new(config: &InfinibandConfig, roots: &Roots) -> Self {
        Infiniband {
            class_dir: roots.sys("class/infiniband"),
            hw_counters: config.hw_counters,
            devices_wanted: config.devices.clone(),
            listed: None,
            devices: Vec::new(),
            stale: true,
            ticks: 0,
            buf: Vec::new(),
            listing: Vec::new(),
            port_rows: BatchBuilder::new(&PORT),
            link_rows: BatchBuilder::new(&LINK),
            device_rows: BatchBuilder::new(&DEVICE),
            hw_rows: BatchBuilder::new(&HW_COUNTER),
            hw_values: Vec::new(),
            seen: Vec::new(),
            problems: Vec::new(),
            walk_errors: Vec::new(),
            errors: Vec::new(),
            sysfs: roots.sysfs.clone(),
            controllers_without_device: Vec::new(),
            bus_read: false,
        }
    }

    /// The InfiniBand controllers on the PCI bus without an RDMA device,
    /// each as a source that reads badly: their ports are unread, and
    /// without this the collector would wait (no `class/infiniband`) or read
    /// the other HCAs as if they were all. Left out: virtual functions (idle
    /// until something takes them), functions handed to a VM, and every
    /// controller when `collectors.infiniband.devices` picks the devices.
    fn read_controllers_without_device(&self) -> Vec<ParseError> {
        if !self.devices_wanted.is_empty() {
            return Vec::new();
        }
        let controllers = crate::pci::infiniband_controllers(&self.sysfs).unwrap_or_default();
        controllers
            .into_iter()
            .filter(|c| !c.virtual_function && !c.given_to_a_vm() && c.rdma_devices.is_empty())
            .map(|c| ParseError {
                path: self.sysfs.join("bus/pci/devices").join(&c.address).display().to_string(),
                line: 0,
                reason: match &c.driver {
                    Some(driver) => format!(
                        "an InfiniBand controller bound to {driver} with no RDMA device: the \
                         driver did not bring it up (dmesg names why: firmware, a health \
                         error) or its RDMA module (mlx5_ib) is not loaded; its ports are not read"
                    ),
                    None => "an InfiniBand controller bound to no driver (dmesg says why); its \
                             ports are not read"
                        .to_string(),
                },
            })
            .collect()
    }

    /// Lists `class_dir` into `self.listing`, sorted; `false` when it is absent.
    pub(super) fn list_class_dir(&mut self) -> anyhow::Result<bool> {
        self.listing.clear();
        let entries = match std::fs::read_dir(&self.class_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(anyhow!("{}: {e}", self.class_dir.display())),
        };
        for entry in entries {
            let entry = entry.map_err(|e| anyhow!("{}: {e}", self.class_dir.display()))?;
            self.listing.push(entry.file_name());
        }
        self.listing.sort();
        Ok(true)
    }

    /// Walks the tree again if the device list changed, a cached file went
    /// missing, or the walk is old.
    pub(super) fn refresh(&mut self) -> anyhow::Result<()> {
        let present = self.list_class_dir()?;
        let same_list = match &self.listed {
            Some(listed) => present && *listed == self.listing,
            None => !present,
        };
        // A controller's RDMA device comes and goes with the list.
        if !same_list || !self.bus_read {
            self.controllers_without_device = self.read_controllers_without_device();
            self.bus_read = true;
        }
        if same_list && !self.stale && !self.ticks.is_multiple_of(RESCAN_TICKS) {
            return Ok(());
        }
        self.listed = present.then(|| self.listing.clone());
        // Counters read from their wider set stay on it across the walk
        // (`Counter::on_fallback`): a walk is once a minute.
        let on_fallback: std::collections::HashSet<PathBuf> = self
            .devices
            .iter()
            .flat_map(|d| &d.ports)
            .flat_map(|p| &p.counters)
            .filter(|c| c.on_fallback)
            .map(|c| c.file.path().to_path_buf())
            .collect();
        self.devices.clear();
        self.walk_errors.clear();
        // Until this walk completes, the next tick walks again.
        self.stale = true;
        if !present {
            self.stale = false;
            return Ok(());
        }
        let mut names: Vec<String> = self
            .listing
            .iter()
            .filter_map(|n| n.to_str().map(str::to_owned))
            .filter(|n| self.devices_wanted.is_empty() || self.devices_wanted.contains(n))
            .collect();
        names.sort_by(|a, b| natural_key(a).cmp(&natural_key(b)));
        for name in names {
            // Real sysfs holds symlinks to the device under /sys/devices: join
            // and read through them (metadata and read_dir follow links).
            let dir = self.class_dir.join(&name);
            let errors = &mut self.walk_errors;
            if let Some(mut device) =
                walk_device(name, dir, self.hw_counters, &mut self.buf, errors)
            {
                for counter in device.ports.iter_mut().flat_map(|p| &mut p.counters) {
                    counter.on_fallback = counter.fallback.is_some()
                        && on_fallback.contains(counter.file.path());
                }
                self.devices.push(device);
            }
        }
        self.stale = false;
        Ok(())
    }

    /// Reads every cached port once and fills the builders.
    pub(super) fn read_all(&mut self, time_us: i64) -> anyhow::Result<()> {
        let Infiniband {
            devices,
            buf,
            port_rows,
            link_rows,
            device_rows,
            hw_rows,
            hw_values,
            seen,
            problems,
            errors,
            stale,
            ..
        } = self;
        for (device_index, device) in devices.iter_mut().enumerate() {
            let mut any_port = false;
            for (port_index, port) in device.ports.iter_mut().enumerate() {
                if port.dir_changed() {
                    // Gone, or files came or went: read through the paths this
                    // tick, as a fresh walk would, and walk again next tick.
                    port.close_files();
                    *stale = true;
                }
                let mut values = PortRow::default();
                // A port that went mid-read is no error: its files' are dropped.
                let errors_before = errors.len();
                let Some(link) = read_port(port, buf, &mut values, problems, errors, stale) else {
                    errors.truncate(errors_before);
                    continue;
                };
                hw_values.clear();
                if !read_hw(
                    &mut port.hw,
                    &port.dir,
                    buf,
                    hw_values,
                    problems,
                    errors,
                    stale,
                ) {
                    errors.truncate(errors_before);
                    continue; // the port went away between its counters and hw_counters
                }
                any_port = true;
                let rate_text = if link.rate.is_some() {
                    port.rate_text.as_str()
                } else {
                    ""
                };
                let row = PortRow {
                    device: &device.name,
                    port: &port.num,
                    ..values
                };
                port_rows.push_row(time_us, &row)?;
                link_rows.push_row(
                    time_us,
                    &LinkRow {
                        device: &device.name,
                        port: &port.num,
                        link_layer: &port.link_layer,
                        state: link.state,
                        phys_state: link.phys_state,
                        rate: rate_text,
                        lid: &port.lid,
                        info: 1,
                    },
                )?;
                for (hw, value) in port.hw.iter().zip(hw_values.iter()) {
                    hw_rows.push_row(
                        time_us,
                        &HwCounterRow {
                            device: &device.name,
                            port: &port.num,
                            counter: &hw.name,
                            value: *value,
                        },
                    )?;
                }
                port_problems(&link, &row, port, problems);
                seen.push(PortSeen {
                    device: device_index,
                    port: port_index,
                    state: link.state,
                    rate: link.rate,
                });
            }
            if !any_port && !device.dir.exists() {
                *stale = true;
                continue; // the device went away
            }
            hw_values.clear();
            let errors_before = errors.len();
            if read_hw(
                &mut device.hw,
                &device.dir,
                buf,
                hw_values,
                problems,
                errors,
                stale,
            ) {
                for (hw, value) in device.hw.iter().zip(hw_values.iter()) {
                    hw_rows.push_row(
                        time_us,
                        &HwCounterRow {
                            device: &device.name,
                            port: "",
                            counter: &hw.name,
                            value: *value,
                        },
                    )?;
                }
            } else {
                errors.truncate(errors_before);
            }
            device_rows.push_row(
                time_us,
                &DeviceRow {
                    device: &device.name,
                    hca_type: &device.hca_type,
                    board_id: &device.board_id,
                    fw_ver: &device.fw_ver,
                    node_guid: &device.node_guid,
                    info: 1,
                },
            )?;
        }
        Ok(())
    }

    /// Why there is nothing to read, when there is nothing.
    pub(super) fn absent_reason(&self) -> Option<String> {
        let dir = self.class_dir.display();
        if self.listed.is_none() {
            return Some(format!("no {dir}: no RDMA devices or driver not loaded"));
        }
        if self.devices.is_empty() {
            if self.listing.is_empty() {
                return Some(format!("{dir} is empty: no RDMA devices"));
            }
            if !self.devices_wanted.is_empty() {
                return Some(format!(
                    "none of collectors.infiniband.devices ({}) is under {dir}",
                    self.devices_wanted.join(", ")
                ));
            }
            return Some(format!("no device under {dir} could be read"));
        }
        None
    }
}

impl Collector for Infiniband {
    fn name(&self) -> &'static str {
        "infiniband"
    }

    fn probe(&mut self) -> Availability {
        self.stale = true;
        if let Err(e) = self.collect(0) {
            // No class dir lists as none (`absent_reason`); an error here is
            // a source that reads badly, probed again until it mends.
            return Availability::Failed(format!("{e:#}"));
        }
        if let Some(reason) = self.absent_reason() {
            return Availability::Absent(reason);
        }
        let ports: Vec<String> = self
            .seen
            .iter()
            .map(|p| {
                let port = &self.devices[p.device].ports[p.port];
                let rate = p
                    .rate
                    .map(|bits| format!(" {} Gb/s", format_gbits(bits)))
                    .unwrap_or_default();
                let layer = match port.link_layer.as_str() {
                    "InfiniBand" => " IB",
                    "Ethernet" => " RoCE",
                    _ => "",
                };
                format!("{} {}{rate}{layer}", port.label, p.state)
            })
            .collect();
        Availability::Available(format!(
            "{} HCA{}, {} port{}: {}",
            self.devices.len(),
            plural(self.devices.len()),
            ports.len(),
            plural(ports.len()),
            ports.join(", ")
        ))
    }

    fn collect(&mut self, time_us: i64) -> anyhow::Result<Vec<Batch>> {
        self.problems.clear();
        self.seen.clear();
        self.errors.clear();
        self.refresh()?;
        self.ticks = self.ticks.wrapping_add(1);
        self.errors.extend(self.walk_errors.iter().cloned());
        self.errors.extend(self.controllers_without_device.iter().cloned());
        let result = self.read_all(time_us);
        // Finish every builder even on error so no half-tick leaks into the next.
        let batches = [
            self.port_rows.finish(),
            self.link_rows.finish(),
            self.device_rows.finish(),
            self.hw_rows.finish(),
        ];
        result?;
        if batches.iter().all(|b| b.is_empty()) && !self.errors.is_empty() {
            // Nothing read well: the source is bad, not a file of it. With
            // no RDMA device at all, every HCA on the bus is why, not the
            // first alone.
            let missing = &self.controllers_without_device;
            if self.devices.is_empty() && missing.len() > 1 {
                let each: Vec<&str> = missing.iter().map(|e| e.path.as_str()).collect();
                return Err(anyhow!(
                    "{} InfiniBand controllers on the PCI bus and no RDMA device of any ({}): \
                     the driver did not bring them up (dmesg names why) or the RDMA module \
                     (mlx5_ib) is not loaded; no port is read",
                    missing.len(),
                    each.join(", ")
                ));
            }
            return Err(self.errors.remove(0).into());
        }
        for wanted in &self.devices_wanted {
            if !self.devices.iter().any(|d| &d.name == wanted) {
                self.problems.push(format!(
                    "collectors.infiniband.devices names {wanted}, which is not under {}",
                    self.class_dir.display()
                ));
            }
        }
        Ok(batches.into_iter().filter(|b| !b.is_empty()).collect())
    }

    fn problems(&self) -> Vec<String> {
        self.problems.clone()
    }

    fn source_errors(&self) -> Vec<ParseError> {
        self.errors.clone()
    }
}
