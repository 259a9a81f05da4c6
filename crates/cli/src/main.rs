//! Run meshwire from the command line: a node, its identity, its status, the demo or the lab.

mod demo;
mod lab;
mod progress;
mod settings;
mod signals;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::{Parser, Subcommand};
use meshwire::protocols::ECHO;
use meshwire::{ConnectionEvent, Keypair};
use meshwire_objects::net::Daemon;

use crate::settings::{NodeArgs, Settings};
use crate::signals::Stop;

// Counting costs a thread-local increment per allocation; it lets `meshwire lab` measure a
// sender's heap (scenarios/safe-fanout.toml).
#[global_allocator]
static ALLOCATOR: meshwire_alloc_count::CountingAllocator = meshwire_alloc_count::CountingAllocator;

#[derive(Debug, Parser)]
#[command(
    name = "meshwire",
    version,
    about = "A networking stack for decentralized networks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a node until interrupted: dial configured peers, accept others, answer echo requests,
    /// store and replicate objects, serve the HTTP API.
    Node(NodeArgs),
    /// Print the node's PeerId (creating its identity in the data directory on first use).
    Id {
        /// The node's data directory.
        #[arg(long, default_value = "meshwire-data")]
        data_dir: PathBuf,
    },
    /// Ask a running node how it is: peers, gossip and object health, and a verdict. Exits 0
    /// when healthy, 1 when unhealthy, 2 when the node cannot be asked.
    Status(status::StatusArgs),
    /// Start 5 nodes on loopback, exchange messages, requests and a fan-out, PUT and GET an object
    /// over their HTTP APIs, print a table and the URLs.
    Demo {
        /// Keep the nodes and their HTTP APIs running until ctrl-c or SIGTERM.
        #[arg(long)]
        serve: bool,
    },
    /// Run emulated-network scenarios in virtual time.
    #[command(subcommand)]
    Lab(lab::LabCommand),
}

fn main() -> anyhow::Result<ExitCode> {
    // Request bodies and objects of megabytes go back to the system when freed, so a node's RSS
    // follows its working set (the store's memory budget, docs/node.md).
    meshwire_alloc_count::map_large_allocations(1 << 20);
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,turmoil=warn")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: logs piped to a file or journald stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match cli.command {
        Command::Node(args) => runtime.block_on(run_node(args))?,
        Command::Id { data_dir } => {
            let keypair = Keypair::load_or_create(&data_dir)?;
            println!("{}", keypair.peer_id());
        }
        Command::Status(args) => return Ok(runtime.block_on(status::run(args))),
        Command::Demo { serve } => runtime.block_on(demo::run(serve))?,
        // The lab drives its own virtual-time runtimes.
        Command::Lab(command) => lab::run(command)?,
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_node(args: NodeArgs) -> anyhow::Result<()> {
    let settings = Settings::load(&args)?;
    if args.check_config {
        println!("{}", settings.check()?);
        return Ok(());
    }
    // Signal handlers first, so a SIGTERM during startup is not the default (immediate) exit.
    let mut stop = Stop::install()?;
    let mut builder = Daemon::builder(settings.objects);
    if let Some(ring) = settings.ring.clone() {
        builder = builder.ring(ring);
    }
    let daemon = builder
        .members(settings.members.iter().copied())
        .data_dir(&settings.data_dir)
        .store_memory_bytes(settings.store_memory_bytes)
        .http(settings.http)
        .http_limits(settings.http_limits.clone())
        .http_auth(settings.http_auth.clone())
        .topics(settings.topics.clone())
        .bind(settings.listen, |config| settings.apply(config))
        .await?;
    let node = daemon.node().clone();
    node.handle(ECHO, |_, body: Bytes| async move { Ok(body) })?;
    tracing::info!(
        peer_id = %node.peer_id(),
        address = %node.local_addr()?,
        http = %format!("http://{}", daemon.http_address().unwrap_or(settings.http)),
        "node running; stop with ctrl-c or SIGTERM"
    );
    if let Some(topics) = daemon.topics() {
        let names: Vec<&String> = topics.topics().keys().collect();
        tracing::info!(
            topics = ?names,
            "gossip topics: POST /topics/{{name}} publishes, GET /topics/{{name}}/events subscribes"
        );
    }
    if let Some(ring) = daemon.ring() {
        let status = ring.status();
        tracing::info!(
            position = status.position,
            ring = status.ring_len,
            "batch pipeline: {}",
            if ring.is_first() {
                "this node submits (POST /pipeline/batches)"
            } else {
                "this node relays"
            }
        );
    }
    let members = daemon.service().members();
    if members.len() == 1 {
        tracing::warn!(
            "no object members configured (--member, [objects] members): this node is a cluster \
             of one; it stores every object itself and refuses other nodes' object requests"
        );
    } else {
        tracing::info!(
            members = members.len(),
            "object cluster (this node included)"
        );
    }
    if let Some(token) = daemon.http_token() {
        let path = token
            .path
            .as_ref()
            .map_or_else(|| "(memory)".to_string(), |p| p.display().to_string());
        let loopback = daemon
            .http_address()
            .is_some_and(|address| address.ip().is_loopback());
        let required = match (daemon.http_token_required(), loopback) {
            (true, _) => "required on every request",
            (false, true) => "optional on loopback",
            (false, false) => "NOT required: --danger-http-without-token, anyone can write",
        };
        // The secret itself is printed once, when it is created; afterwards only its file.
        if token.created {
            println!(
                "HTTP token ({required}): {} (saved in {path})",
                token.secret
            );
        } else {
            println!("HTTP token ({required}): in {path}");
        }
        println!("  use: curl -H \"Authorization: Bearer $(cat {path})\" ...");
    }
    let mut events = node.events();
    // Every member can share one config file listing all of them: this node skips itself.
    for peer in settings
        .peers
        .iter()
        .filter(|p| p.peer_id != node.peer_id())
    {
        match peer.address.parse() {
            Ok(address) => node.add_peer(address, peer.peer_id)?,
            Err(_) => {
                tokio::spawn(follow_peer_name(node.clone(), peer.clone()));
            }
        }
    }
    let mut status = tokio::time::interval(Duration::from_secs(30));
    loop {
        tokio::select! {
            signal = stop.next() => {
                tracing::info!(signal, "stopping");
                break;
            }
            event = events.recv() => match event {
                Ok(ConnectionEvent::Connected { peer, address, direction }) => {
                    tracing::info!(peer = %peer, %address, ?direction, "connected");
                }
                Ok(ConnectionEvent::Disconnected { peer, reason }) => {
                    tracing::info!(peer = %peer, %reason, "disconnected");
                }
                Ok(ConnectionEvent::Reconnecting { peer, attempt, delay }) => {
                    tracing::info!(peer = %peer.short(), attempt, ?delay, "redialing");
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(skipped)) => {
                    tracing::warn!(skipped, "missed connection events");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            },
            _ = status.tick() => {
                for peer in node.peers() {
                    tracing::info!(
                        peer = %peer.peer.short(),
                        connected = peer.connected,
                        rtt_ms = peer.rtt.map(|rtt| rtt.as_secs_f64() * 1e3),
                        queued = peer.queued_messages,
                        "peer status"
                    );
                }
            }
        }
    }
    tracing::info!("shutting down");
    daemon.shutdown().await?;
    tracing::info!("stopped");
    Ok(())
}

/// Keeps a peer configured by DNS name at the address its name resolves to: retries the first
/// lookup with backoff (a Kubernetes pod's name exists only once the pod does), then looks it up
/// again every 30 s, so a peer that comes back at a new address (a rescheduled pod) is redialed
/// there.
async fn follow_peer_name(node: meshwire::Node, peer: settings::PeerAddress) {
    let ipv4 = node.local_addr().map_or(true, |local| local.is_ipv4());
    let mut delay = Duration::from_secs(1);
    let mut current = None;
    loop {
        match peer.resolve(ipv4).await {
            Ok(address) if current != Some(address) => {
                if let Err(error) = node.add_peer(address, peer.peer_id) {
                    tracing::warn!(peer = %peer.peer_id, %error, "cannot add peer");
                    return;
                }
                tracing::info!(peer = %peer.peer_id.short(), name = %peer.address, %address, "peer address");
                current = Some(address);
                delay = Duration::from_secs(30);
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(peer = %peer.peer_id.short(), name = %peer.address, %error, ?delay, "cannot resolve peer");
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
        tokio::time::sleep(delay).await;
    }
}
