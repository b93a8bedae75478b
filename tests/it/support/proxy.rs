//! A TCP proxy in front of the API server that a test can cut and restore, to play a network
//! partition between one controller and the control plane.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        Self::start_with_latency(upstream, Duration::ZERO).await
    }

    /// A proxy that holds every chunk it forwards, in either direction, for `latency` (a slow
    /// network: each request and each TLS handshake round trip pays it).
    pub async fn start_with_latency(upstream: SocketAddr, latency: Duration) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let accept = tokio::spawn({
            let cut = cut.clone();
            let generation = generation.clone();
            async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    if cut.load(Ordering::Acquire) {
                        continue; // dropped: refused while cut
                    }
                    let mut cancelled = generation.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut server) = TcpStream::connect(upstream).await else { return };
                        if latency.is_zero() {
                            tokio::select! {
                                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                                _ = cancelled.changed() => {}
                            }
                            return;
                        }
                        let (client_read, client_write) = client.split();
                        let (server_read, server_write) = server.split();
                        tokio::select! {
                            _ = slow_copy(client_read, server_write, latency) => {}
                            _ = slow_copy(server_read, client_write, latency) => {}
                            _ = cancelled.changed() => {}
                        }
                    });
                }
            }
        });
        Proxy { addr, cut, generation, accept }
    }

    /// Close every open connection and refuse new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn restore(&self) {
        self.cut.store(false, Ordering::Release);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

/// Copy `from` to `to`, each chunk after `latency`.
async fn slow_copy(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    latency: Duration,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        tokio::time::sleep(latency).await;
        to.write_all(&buf[..n]).await?;
    }
}

/// The API server's address, from the admin kubeconfig.
pub fn api_server_addr() -> SocketAddr {
    let text = std::fs::read_to_string(super::kubeconfig_path()).expect("read the admin kubeconfig");
    server_line(&text).1
}

fn server_line(text: &str) -> (&str, SocketAddr) {
    let line = text.lines().find(|l| l.trim_start().starts_with("server:")).expect("a server line");
    let server = line.trim().trim_start_matches("server:").trim().trim_start_matches("https://");
    (line, server.parse().expect("server is host:port"))
}

/// A kubeconfig like the admin one whose server is `addr` (the serving certificate is for
/// 127.0.0.1, whatever the port).
pub fn kubeconfig_via(addr: SocketAddr, name: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(super::kubeconfig_path()).expect("read the admin kubeconfig");
    let (line, _) = server_line(&text);
    let rewritten = text.replace(line, &format!("    server: https://{addr}"));
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.kubeconfig"));
    std::fs::write(&path, rewritten).expect("write the proxied kubeconfig");
    path
}
