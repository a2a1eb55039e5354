//! Starts the `/metrics` server from `[web]`.

use std::sync::Arc;

use anyhow::Result;
use vtax_exporters::{Exposition, WebServer};

use crate::config::{parse_listen_address, WebConfig};

/// Serves `exposition` as `[web]` says.
pub fn start(config: &WebConfig, exposition: Arc<Exposition>) -> Result<WebServer> {
    let address = parse_listen_address(&config.listen_address).map_err(anyhow::Error::msg)?;
    vtax_exporters::serve(address, config.config_file.clone(), exposition)
}
