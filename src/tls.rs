//! Serving an API over plain HTTP or over TLS (rustls), for the admin and the executor alike.
//!
//! [`serve`] runs an axum router on a bound listener until a shutdown future resolves; with a
//! certificate and key (PEM files, `--tls-cert`/`--tls-key`) every connection is a TLS one.
//! Handshakes run on their own tasks, each bounded in time, so a client that connects and says
//! nothing holds up no one. Clients are not asked for certificates: callers authenticate with
//! their tokens, as over plain HTTP.
//!
//! The client side of TLS (roots, `--ca-file`) is the protocol client's business, not this one's.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::serve::{Listener, ListenerExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client has to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads a PEM certificate chain and its private key into a server configuration.
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|error| anyhow::anyhow!("reading the certificate {}: {error}", cert.display()))?;
    if chain.is_empty() {
        anyhow::bail!("{} holds no PEM certificate", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|error| anyhow::anyhow!("reading the private key {}: {error}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the certificate does not match its key")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `app` on `listener` (over TLS when `tls` is given) until `shutdown` resolves, then
/// lets the requests in flight finish. Handlers see the peer's address as
/// `ConnectInfo<SocketAddr>` either way.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    match tls {
        None => axum::serve(listener, app).with_graceful_shutdown(shutdown).await,
        Some(config) => {
            // `tap_io` gives the listener axum's `ConnectInfo<SocketAddr>` support.
            let listener = TlsListener::new(listener, config).tap_io(|_| {});
            axum::serve(listener, app).with_graceful_shutdown(shutdown).await
        }
    }
}

/// Serves `app` on `listener` (see [`serve`]) in a task of its own, instrumented with `span`,
/// until `shutdown` is cancelled; a serving error is logged as `{what} stopped`.
pub fn spawn_server(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    shutdown: tokio_util::sync::CancellationToken,
    span: tracing::Span,
    what: &'static str,
) -> tokio::task::JoinHandle<()> {
    use tracing::Instrument;
    tokio::spawn(
        async move {
            let stopped = async move { shutdown.cancelled().await };
            if let Err(error) = serve(listener, tls, app, stopped).await {
                tracing::error!(%error, "{what} stopped");
            }
        }
        .instrument(span),
    )
}

/// A listener whose connections have completed a TLS handshake.
struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: std::io::Result<SocketAddr>,
}

impl TlsListener {
    fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> TlsListener {
        let local_addr = listener.local_addr();
        let (sender, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = sender.closed() => return,
                    accepted = listener.accept() => accepted,
                };
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors and the like: wait, as axum does.
                        tracing::warn!(%error, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, sender) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let _ = sender.send((stream, peer)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%error, "TLS handshake with {peer} failed")
                        }
                        Err(_) => tracing::debug!("TLS handshake with {peer} timed out"),
                    }
                });
            }
        });
        TlsListener { ready, local_addr }
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop ended (it never does while this listener lives).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        match &self.local_addr {
            Ok(address) => Ok(*address),
            Err(error) => Err(std::io::Error::new(error.kind(), error.to_string())),
        }
    }
}
