//! Starts the `/metrics` server from `[web]`.

use std::sync::Arc;

use anyhow::Result;
use vtax_exporters::{Exposition, WebServer};

use crate::config::{parse_listen_address, WebConfig};

/// Serves `exposition` as `[web]` says; the server's own counters go to
/// `exposition` and, as rows of the `web` table, to `rows`.
pub fn start(
    config: &WebConfig,
    exposition: Arc<Exposition>,
    rows: vtax_store::hub::RowSender,
) -> Result<WebServer> {
    let address = parse_listen_address(&config.listen_address).map_err(anyhow::Error::msg)?;
    let server = vtax_exporters::serve(address, config.config_file.clone(), exposition)?;
    server.publish_stats(rows);
    Ok(server)
}
