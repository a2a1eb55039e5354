//! Scrape-latency load generator: N concurrent scrapers on keep-alive
//! connections, each asking for `/metrics` the way Prometheus does (gzip, the
//! text format), recording every response's latency in an HDR histogram.
//!
//! With `--synthetic-series N` it first serves N synthetic series from vtax's
//! own exposition and server in this process (the `/metrics` bar: 10k series,
//! 50 scrapers); with `--target host:port` it loads any exporter instead
//! (node_exporter, a running agent) so peers are measured with the same client.
//!
//! cargo run --release -p vtax-exporters --example scrape_load -- \
//!     --synthetic-series 10000 --scrapers 50 --seconds 20

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use vtax_exporters::Exposition;
use vtax_store::schema::{FieldDef, FieldType, MetricKind, TableDef, TagDef, Unit};
use vtax_store::{BatchBuilder, Value};

#[derive(Parser)]
struct Args {
    /// Serve this many synthetic series in-process and load them.
    #[arg(long)]
    synthetic_series: Option<usize>,
    /// Load this address instead.
    #[arg(long)]
    target: Option<SocketAddr>,
    /// Concurrent scrapers, one keep-alive connection each.
    #[arg(long, default_value_t = 50)]
    scrapers: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Milliseconds each scraper waits between its scrapes; 0 scrapes back to back.
    #[arg(long, default_value_t = 0)]
    interval_ms: u64,
    /// Ask for gzip, as Prometheus does.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    gzip: bool,
    /// Re-render the synthetic exposition this often (ms), as collectors would.
    #[arg(long, default_value_t = 1000)]
    update_ms: u64,
}

static SERIES: TableDef = TableDef {
    name: "synthetic",
    help: "Synthetic series for the scrape benchmark.",
    tags: &[
        TagDef {
            name: "gpu",
            help: "GPU index.",
        },
        TagDef {
            name: "link",
            help: "Link index.",
        },
    ],
    fields: &[
        FieldDef {
            name: "rx_bytes",
            ty: FieldType::F64,
            kind: MetricKind::Counter,
            unit: Unit::Bytes,
            help: "Bytes received.",
        },
        FieldDef {
            name: "tx_bytes",
            ty: FieldType::F64,
            kind: MetricKind::Counter,
            unit: Unit::Bytes,
            help: "Bytes sent.",
        },
        FieldDef {
            name: "errors",
            ty: FieldType::U64,
            kind: MetricKind::Counter,
            unit: Unit::None,
            help: "Errors.",
        },
        FieldDef {
            name: "temperature_celsius",
            ty: FieldType::F64,
            kind: MetricKind::Gauge,
            unit: Unit::Celsius,
            help: "Temperature.",
        },
    ],
    exported: true,
};

fn synthetic_batch(series: usize, tick: u64) -> vtax_store::Batch {
    let rows = series.div_ceil(SERIES.fields.len());
    let mut builder = BatchBuilder::new(&SERIES);
    for row in 0..rows {
        let gpu = (row / 64).to_string();
        let link = (row % 64).to_string();
        let t = tick as f64;
        builder
            .push(
                0,
                &[&gpu, &link],
                &[
                    Value::F64(1.0e12 + t * 25.0e9 + row as f64 * 1234.5),
                    Value::F64(2.0e12 + t * 24.0e9 + row as f64 * 987.25),
                    Value::U64(tick + row as u64),
                    Value::F64(40.0 + (row % 30) as f64 + (tick % 7) as f64 * 0.5),
                ],
            )
            .unwrap();
    }
    builder.finish()
}

fn scrape(
    stream: &mut TcpStream,
    reader: &mut BufReader<TcpStream>,
    request: &[u8],
    body: &mut Vec<u8>,
) -> std::io::Result<usize> {
    stream.write_all(request)?;
    let mut length = None;
    let mut chunked = false;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse::<usize>().ok();
            }
            if k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked") {
                chunked = true;
            }
        }
    }
    if chunked {
        // Exporters that stream (node_exporter's gzip writer) send chunks.
        body.clear();
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(std::io::Error::other)?;
            let start = body.len();
            body.resize(start + size + 2, 0);
            reader.read_exact(&mut body[start..])?;
            body.truncate(start + size);
            if size == 0 {
                return Ok(body.len());
            }
        }
    }
    let length = length.ok_or_else(|| std::io::Error::other("no content-length"))?;
    body.resize(length, 0);
    reader.read_exact(body)?;
    Ok(length)
}

fn main() {
    let args = Args::parse();
    let stop = Arc::new(AtomicBool::new(false));
    let mut _server = None;
    let target = match (args.target, args.synthetic_series) {
        (Some(t), _) => t,
        (None, Some(series)) => {
            let exposition = Exposition::new(&[&SERIES]);
            exposition.update("synthetic", vec![Arc::new(synthetic_batch(series, 0))]);
            let text = exposition.body(vtax_exporters::Format::Text, false);
            let text_gzip = exposition.body(vtax_exporters::Format::Text, true);
            eprintln!(
                "serving {} samples: text {} bytes, gzip {} bytes",
                exposition.bodies().samples,
                text.len(),
                text_gzip.len()
            );
            {
                let exposition = exposition.clone();
                std::thread::spawn(move || exposition.run_renderer(Duration::from_millis(20)));
            }
            {
                let exposition = exposition.clone();
                let stop = stop.clone();
                let update = Duration::from_millis(args.update_ms);
                std::thread::spawn(move || {
                    let mut tick = 0;
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(update);
                        tick += 1;
                        exposition
                            .update("synthetic", vec![Arc::new(synthetic_batch(series, tick))]);
                    }
                });
            }
            let server =
                vtax_exporters::serve("127.0.0.1:0".parse().unwrap(), None, exposition).unwrap();
            let addr = server.local_addr();
            _server = Some(server);
            addr
        }
        (None, None) => panic!("give --synthetic-series N or --target host:port"),
    };
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: {target}\r\nUser-Agent: scrape_load\r\nAccept: text/plain;version=0.0.4;q=1,*/*;q=0.1\r\n{}\r\n",
        if args.gzip { "Accept-Encoding: gzip\r\n" } else { "" }
    );
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let threads: Vec<_> = (0..args.scrapers)
        .map(|i| {
            let request = request.clone().into_bytes();
            let interval = Duration::from_millis(args.interval_ms);
            std::thread::spawn(move || {
                let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
                let mut stream = TcpStream::connect(target).unwrap();
                stream.set_nodelay(true).unwrap();
                let mut reader = BufReader::with_capacity(256 << 10, stream.try_clone().unwrap());
                let mut body = Vec::new();
                let mut bytes = 0u64;
                // Spread paced scrapers over their interval, as Prometheus does.
                let mut next = Instant::now() + interval.mul_f64(i as f64 / 50.0 % 1.0);
                while Instant::now() < deadline {
                    if !interval.is_zero() {
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        }
                        next += interval;
                    }
                    let t0 = Instant::now();
                    bytes += scrape(&mut stream, &mut reader, &request, &mut body).expect("scrape")
                        as u64;
                    histogram
                        .record(t0.elapsed().as_micros().max(1) as u64)
                        .unwrap();
                }
                (histogram, bytes)
            })
        })
        .collect();
    let mut total = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let mut bytes = 0;
    for t in threads {
        let (h, b) = t.join().unwrap();
        total.add(h).unwrap();
        bytes += b;
    }
    stop.store(true, Ordering::Relaxed);
    let secs = started.elapsed().as_secs_f64();
    println!(
        "target={target} scrapers={} interval_ms={} gzip={} scrapes={} scrapes_per_s={:.0} body_bytes_mean={} p50_ms={:.3} p90_ms={:.3} p99_ms={:.3} p999_ms={:.3} max_ms={:.3}",
        args.scrapers,
        args.interval_ms,
        args.gzip,
        total.len(),
        total.len() as f64 / secs,
        bytes / total.len().max(1),
        total.value_at_quantile(0.5) as f64 / 1000.0,
        total.value_at_quantile(0.9) as f64 / 1000.0,
        total.value_at_quantile(0.99) as f64 / 1000.0,
        total.value_at_quantile(0.999) as f64 / 1000.0,
        total.max() as f64 / 1000.0,
    );
}
