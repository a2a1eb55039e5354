//! The server: connections with their limits and idle timeout, and the
//! answer to each request.

use super::*;

/// A running `/metrics` server.
pub struct WebServer {
    pub(super) runtime: Option<tokio::runtime::Runtime>,
    pub(super) local_addr: SocketAddr,
    pub(super) shutdown: Arc<tokio::sync::Notify>,
    pub(super) shared: Arc<Shared>,
}

impl WebServer {
    /// The address it listens on (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What it holds and refused since it started.
    pub fn stats(&self) -> WebStats {
        self.shared.stats()
    }

    /// Publishes [`WebServer::stats`] once a second as a row of [`TABLE`]:
    /// staged in the exposition (shown with the collectors' next render) and
    /// sent on `rows` (the store's channel), so it is stored like any table.
    pub fn publish_stats(&self, rows: vtax_store::hub::RowSender) {
        let Some(runtime) = &self.runtime else {
            return;
        };
        let shared = self.shared.clone();
        runtime.spawn(async move {
            let mut every = tokio::time::interval(STATS_INTERVAL);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let time_us = vtax_store::clock::now_us();
                let row = Arc::new(shared.stats().row(time_us));
                shared.exposition.stage(STATS_SOURCE, vec![row.clone()]);
                if rows.send(vec![row]).is_err() {
                    return;
                }
            }
        });
    }

    /// Stops accepting and drops open connections.
    pub fn stop(mut self) {
        self.shutdown.notify_waiters();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        }
    }
}

/// What every connection of a server shares.
pub(super) struct Shared {
    pub(super) exposition: Arc<Exposition>,
    pub(super) counters: Counters,
    /// One permit per open connection.
    pub(super) connections: Arc<tokio::sync::Semaphore>,
    pub(super) max_connections: usize,
    pub(super) bcrypt_slots: Arc<tokio::sync::Semaphore>,
    /// The open connections, by a number of their own.
    pub(super) open: Mutex<HashMap<u64, Arc<Tracked>>>,
    pub(super) next_id: AtomicU64,
    /// What [`Tracked::active_ms`] counts from.
    pub(super) started: Instant,
}

/// One open connection, as the room it makes when the server is full.
pub(super) struct Tracked {
    pub(super) id: u64,
    /// When it opened or last began a request, in ms since the server started.
    active_ms: AtomicU64,
    /// Whether an answer is being written: from the end of the request's
    /// handling (its credentials checked) until hyper has written the body
    /// and dropped it. A request still waiting for its credentials to be
    /// verified is not: its connection may be closed for room, or clients
    /// sending new wrong passwords on every connection would leave nothing
    /// to close and keep out a scraper whose password is verified.
    in_request: AtomicBool,
    /// Told to close to make room.
    pub(super) close: tokio::sync::Notify,
}

impl Tracked {
    fn request_began(&self, shared: &Shared) {
        self.active_ms.store(shared.elapsed_ms(), Ordering::Relaxed);
    }

    /// Marks the connection as answering until the returned guard drops.
    pub(super) fn answering(self: &Arc<Self>) -> Answering {
        self.in_request.store(true, Ordering::Relaxed);
        Answering(self.clone())
    }
}

/// A connection answering a request, for as long as its body lives.
pub(super) struct Answering(Arc<Tracked>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.in_request.store(false, Ordering::Relaxed);
    }
}

/// A response body that keeps its connection counted as answering until
/// hyper has written it whole and dropped it: a large body going to a slow
/// scraper is no connection waiting for a request, and is not closed for
/// room (it had been, once its handling returned).
pub(super) struct AnswerBody {
    body: Full<Bytes>,
    _answering: Answering,
}

impl hyper::body::Body for AnswerBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Shared {
    fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Registers a connection that has just opened.
    pub(super) fn track(&self) -> Arc<Tracked> {
        let tracked = Arc::new(Tracked {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            active_ms: AtomicU64::new(self.elapsed_ms()),
            in_request: AtomicBool::new(false),
            close: tokio::sync::Notify::new(),
        });
        self.open
            .lock()
            .expect("not poisoned")
            .insert(tracked.id, tracked.clone());
        tracked
    }

    pub(super) fn untrack(&self, tracked: &Tracked) {
        self.open.lock().expect("not poisoned").remove(&tracked.id);
    }

    /// Tells the connection that has waited longest without a request
    /// under way (idle, or sending its request head) to close; false when
    /// every open connection is answering one.
    pub(super) fn evict_longest_waiting(&self) -> bool {
        let mut open = self.open.lock().expect("not poisoned");
        let Some(id) = open
            .values()
            .filter(|t| !t.in_request.load(Ordering::Relaxed))
            .min_by_key(|t| t.active_ms.load(Ordering::Relaxed))
            .map(|t| t.id)
        else {
            return false;
        };
        if let Some(victim) = open.remove(&id) {
            // A permit is stored if the connection is not waiting on it yet.
            victim.close.notify_one();
        }
        bump(&self.counters.connections_evicted);
        true
    }

    pub(super) fn stats(&self) -> WebStats {
        let counter = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WebStats {
            connections_open: (self.max_connections - self.connections.available_permits()) as u64,
            connections_refused: counter(&self.counters.connections_refused),
            connections_evicted: counter(&self.counters.connections_evicted),
            connections_timed_out: counter(&self.counters.connections_timed_out),
            auth_failures: counter(&self.counters.auth_failures),
            auth_busy: counter(&self.counters.auth_busy),
        }
    }
}

/// Starts serving `exposition` on `address`, with the web config file if any,
/// under the default [`WebLimits`].
pub fn serve(
    address: SocketAddr,
    web_config_file: Option<PathBuf>,
    exposition: Arc<Exposition>,
) -> anyhow::Result<WebServer> {
    serve_with(address, web_config_file, exposition, WebLimits::default())
}

/// A listener on `address`. Every interface of IPv6 (`[::]:port`, which
/// `:port` means) takes IPv4 as well whatever `net.ipv6.bindv6only` says,
/// and where the kernel has no IPv6 (`ipv6.disable=1`) is every interface
/// of IPv4: bound as it was, the first answered no IPv4 scrape on such a
/// host and the second failed the start, after check-config passed it.
pub(super) fn bind_listener(address: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    if address.ip() != std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) {
        return std::net::TcpListener::bind(address);
    }
    let socket = match Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP)) {
        Ok(socket) => socket,
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            return std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, address.port()));
        }
        Err(e) => return Err(e),
    };
    socket.set_only_v6(false)?;
    socket.set_reuse_address(true)?;
    socket.bind(&address.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// Starts serving `exposition` on `address` under `limits`.
pub fn serve_with(
    address: SocketAddr,
    web_config_file: Option<PathBuf>,
    exposition: Arc<Exposition>,
    limits: WebLimits,
) -> anyhow::Result<WebServer> {
    let web_config = Arc::new(WebConfig::open(web_config_file)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WEB_THREADS)
        .thread_name("web")
        .enable_io()
        .enable_time()
        .build()?;
    let listener = bind_listener(address)
        .and_then(|listener| {
            listener.set_nonblocking(true)?;
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
        })
        .map_err(|e| anyhow::anyhow!("listen on {address}: {e}"))?;
    let local_addr = listener.local_addr()?;
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let stop = shutdown.clone();
    let shared = Arc::new(Shared {
        exposition,
        counters: Counters::default(),
        connections: Arc::new(tokio::sync::Semaphore::new(limits.max_connections)),
        max_connections: limits.max_connections,
        bcrypt_slots: Arc::new(tokio::sync::Semaphore::new(BCRYPT_SLOTS)),
        open: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(0),
        started: Instant::now(),
    });
    let server_shared = shared.clone();
    runtime.spawn(async move {
        let shared = server_shared;
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = stop.notified() => return,
            };
            let slot = match shared.connections.clone().try_acquire_owned() {
                Ok(slot) => Some(slot),
                // Full: the connection that has waited longest for a request
                // makes room, so that clients which open connections and
                // send nothing (or a byte at a time) cannot keep a scraper out.
                Err(_) if shared.evict_longest_waiting() => tokio::time::timeout(
                    EVICTION_WAIT,
                    shared.connections.clone().acquire_owned(),
                )
                .await
                .ok()
                .and_then(Result::ok),
                Err(_) => None,
            };
            let Some(slot) = slot else {
                bump(&shared.counters.connections_refused);
                tracing::debug!(%peer, "Connection refused: max connections open, each in a request.");
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let shared = shared.clone();
            let limits = limits.clone();
            let web_config = web_config.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let tracked = shared.track();
                tokio::select! {
                    () = serve_connection(stream, peer, web_config, shared.clone(), tracked.clone(), &limits) => {}
                    () = tracked.close.notified() => {
                        tracing::debug!(%peer, "Connection closed to make room for a new one.");
                    }
                }
                shared.untrack(&tracked);
            });
        }
    });
    Ok(WebServer {
        runtime: Some(runtime),
        local_addr,
        shutdown,
        shared,
    })
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    web_config: Arc<WebConfig>,
    shared: Arc<Shared>,
    tracked: Arc<Tracked>,
    limits: &WebLimits,
) {
    let idle = Arc::new(AtomicBool::new(false));
    let stream = IdleTimeout::new(stream, limits.idle_timeout, idle.clone());
    // The TLS settings are those in force when the connection opened; the
    // users and headers are read again at each request, so a password taken
    // away no longer opens a connection kept alive since.
    let tls = web_config.current().tls.clone();
    let service = {
        let shared = shared.clone();
        hyper::service::service_fn(move |request| {
            let loaded = web_config.current();
            let shared = shared.clone();
            let tracked = tracked.clone();
            async move {
                tracked.request_began(&shared);
                let mut response = handle(request, &loaded, &shared).await;
                for (name, value) in &loaded.headers {
                    response.headers_mut().insert(name.clone(), value.clone());
                }
                let answering = tracked.answering();
                Ok::<_, std::convert::Infallible>(response.map(|body| AnswerBody {
                    body,
                    _answering: answering,
                }))
            }
        })
    };
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // A scrape's request head is well under a kilobyte: the default
        // buffer of about 400 KiB a connection let clients holding every
        // connection with an unfinished head take tens of megabytes.
        .max_buf_size(MAX_REQUEST_HEAD_BYTES);
    let (result, handshake_timed_out) = match &tls {
        None => (
            http.serve_connection(TokioIo::new(stream), service).await,
            false,
        ),
        Some(acceptor) => {
            match tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(stream)).await
            {
                Ok(Ok(tls)) => (
                    http.serve_connection(TokioIo::new(tls), service).await,
                    false,
                ),
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    (Ok(()), false)
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    (Ok(()), true)
                }
            }
        }
    };
    // hyper reports the header read timeout; an idle timeout while no
    // request is under way ends the connection as quietly as a client's
    // close would, so the stream says whether it fired.
    let header_timed_out = result.as_ref().is_err_and(|e| e.is_timeout());
    if handshake_timed_out || header_timed_out || idle.load(Ordering::Relaxed) {
        bump(&shared.counters.connections_timed_out);
    }
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// A stream that fails with `TimedOut` once no byte moved either way for
/// `timeout` while a read or a write waits: hyper has no such timeout of its
/// own, and its header read timeout does not cover a client that stops
/// reading a response.
pub(super) struct IdleTimeout<T> {
    pub(super) io: T,
    pub(super) timeout: Duration,
    pub(super) last_progress: Instant,
    pub(super) sleep: Pin<Box<tokio::time::Sleep>>,
    /// Set once the timeout fired.
    pub(super) expired: Arc<AtomicBool>,
}

impl<T> IdleTimeout<T> {
    pub(super) fn new(io: T, timeout: Duration, expired: Arc<AtomicBool>) -> Self {
        IdleTimeout {
            io,
            timeout,
            last_progress: Instant::now(),
            sleep: Box::pin(tokio::time::sleep(timeout)),
            expired,
        }
    }

    /// Passes a poll of the inner stream on; while it waits, fails it once
    /// the stream has been idle for the timeout.
    pub(super) fn progress<R>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        if poll.is_ready() {
            self.last_progress = Instant::now();
            return poll;
        }
        // The timer moves on lazily, when it fires before the deadline,
        // rather than at every read and write.
        let deadline = tokio::time::Instant::from_std(self.last_progress + self.timeout);
        if self.sleep.deadline() != deadline {
            self.sleep.as_mut().reset(deadline);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.expired.store(true, Ordering::Relaxed);
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no byte moved either way for the idle timeout",
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleTimeout<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_read(cx, buf);
        this.progress(cx, poll)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.progress(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progress(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.progress(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_shutdown(cx);
        this.progress(cx, poll)
    }
}

/// Answers one request: the method, then the credentials, then the path.
async fn handle(
    request: Request<Incoming>,
    loaded: &Arc<Loaded>,
    shared: &Shared,
) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "Only GET and HEAD.\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let allowed = match loaded.check(request.headers().get(header::AUTHORIZATION)) {
        Check::Allowed => true,
        Check::Denied => false,
        Check::Verify(credential) => {
            // In turn (the semaphore is fair): a new scraper's credential
            // waits behind the wrong ones ahead of it, at most one a
            // connection, rather than being refused while they keep the slot.
            let slot =
                tokio::time::timeout(BCRYPT_WAIT, shared.bcrypt_slots.clone().acquire_owned())
                    .await;
            let Ok(Ok(slot)) = slot else {
                bump(&shared.counters.auth_busy);
                let mut r = plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Busy verifying other credentials; retry.\n",
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return r;
            };
            let loaded = loaded.clone();
            // The slot goes with the verification: a client that hangs up
            // does not free it before bcrypt is done.
            tokio::task::spawn_blocking(move || {
                let _slot = slot;
                loaded.verify(credential)
            })
            .await
            .unwrap_or(false)
        }
    };
    if !allowed {
        bump(&shared.counters.auth_failures);
        let mut r = plain(StatusCode::UNAUTHORIZED, "Unauthorized.\n");
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"vtax\""),
        );
        return r;
    }
    respond(&request, &shared.exposition)
}

pub(super) fn plain(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The answer to an allowed GET or HEAD.
pub(super) fn respond(
    request: &Request<Incoming>,
    exposition: &Exposition,
) -> Response<Full<Bytes>> {
    match request.uri().path() {
        "/metrics" => {
            let headers = request.headers();
            let (format, content_type) = Format::negotiate_media_type(
                headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()),
            );
            let gzip = headers
                .get(header::ACCEPT_ENCODING)
                .and_then(|v| v.to_str().ok())
                .is_some_and(accepts_gzip);
            let body = if request.method() == Method::HEAD {
                Bytes::new()
            } else {
                exposition.body(format, gzip)
            };
            let mut r = Response::new(Full::new(body));
            let h = r.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            if gzip {
                h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            }
            h.insert(
                header::VARY,
                HeaderValue::from_static("Accept, Accept-Encoding"),
            );
            r
        }
        "/" => {
            let mut r = Response::new(Full::new(Bytes::from_static(LANDING_PAGE.as_bytes())));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            r
        }
        _ => plain(
            StatusCode::NOT_FOUND,
            "Not found: the metrics are at /metrics.\n",
        ),
    }
}

/// Whether an `Accept-Encoding` value allows gzip (and does not refuse it with q=0).
pub(super) fn accepts_gzip(value: &str) -> bool {
    value.split(',').any(|part| {
        let mut pieces = part.split(';').map(str::trim);
        let coding = pieces.next().unwrap_or("");
        let refused = pieces.any(|p| {
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q == 0.0)
        });
        (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
    })
}
