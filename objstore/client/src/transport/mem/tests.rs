//! The in-memory network's fault hooks, under a paused clock.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Connects `from` to `to` and accepts on `l`: (client reader, client writer, server reader,
/// server writer).
async fn open(
    net: &MemNetwork,
    l: &mut Listener,
    to: SocketAddr,
) -> (Reader, Writer, Reader, Writer) {
    let (r, w) = net.connect(to).await.unwrap();
    let (sr, sw, _) = l.accept().await.unwrap();
    (r, w, sr, sw)
}

#[tokio::test(start_paused = true)]
async fn a_link_down_resets_and_refuses_until_it_is_up() {
    let net = MemNetwork::new();
    let (a, b, c) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"), addr("10.0.0.3:1"));
    let mut l = net.listen(b).unwrap();
    let (mut r, _w, _sr, mut sw) = open(&net.endpoint(a), &mut l, b).await;
    let (_r2, mut w2, mut sr2, _sw2) = open(&net.endpoint(c), &mut l, b).await;
    assert_eq!(net.connections().len(), 2);
    net.set_link(a, b, Link::Down);
    // a's connection ended: reads see the end, writes towards it break.
    let mut buf = [0u8; 1];
    assert_eq!(r.read(&mut buf).await.unwrap(), 0);
    assert!(sw.write_all(b"x").await.is_err() || sw.flush().await.is_err());
    let e = net.endpoint(a).connect(b).await.err().unwrap();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    // c's link is untouched.
    w2.write_all(b"y").await.unwrap();
    sr2.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"y");
    net.set_link(a, b, Link::Up);
    let (_r, mut w, mut sr, _sw) = open(&net.endpoint(a), &mut l, b).await;
    w.write_all(b"z").await.unwrap();
    sr.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"z");
}

#[tokio::test(start_paused = true)]
async fn a_hung_link_holds_bytes_and_connects_until_it_heals() {
    let net = MemNetwork::new();
    let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
    let mut l = net.listen(b).unwrap();
    let (_r, mut w, mut sr, _sw) = open(&net.endpoint(a), &mut l, b).await;
    net.set_link(a, b, Link::Hang);
    w.write_all(b"held").await.unwrap();
    let mut buf = [0u8; 4];
    let early = tokio::time::timeout(Duration::from_secs(60), sr.read_exact(&mut buf)).await;
    assert!(early.is_err(), "bytes crossed a hung link");
    let ep = net.endpoint(a);
    let connect = tokio::time::timeout(Duration::from_secs(60), ep.connect(b)).await;
    assert!(connect.is_err(), "a connect crossed a hung link");
    net.heal();
    sr.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"held");
}

#[tokio::test(start_paused = true)]
async fn delays_keep_one_connection_in_order_but_let_connections_overtake() {
    let net = MemNetwork::seeded(7);
    let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
    let mut l = net.listen(b).unwrap();
    let ep = net.endpoint(a);
    let (_r1, mut w1, mut sr1, _sw1) = open(&ep, &mut l, b).await;
    net.set_link_delay(
        a,
        b,
        Some(Delay {
            min: Duration::from_secs(5),
            max: Duration::from_secs(5),
        }),
    );
    w1.write_all(b"old1").await.unwrap();
    w1.write_all(b"old2").await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    net.set_link_delay(a, b, None);
    let (_r2, mut w2, mut sr2, _sw2) = open(&ep, &mut l, b).await;
    w2.write_all(b"new!").await.unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 4];
    sr2.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"new!");
    assert!(t0.elapsed() < Duration::from_secs(1));
    let mut buf = [0u8; 8];
    sr1.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"old1old2", "one connection's bytes stay in order");
    assert!(
        t0.elapsed() >= Duration::from_secs(4),
        "the old bytes came later"
    );
}

#[tokio::test(start_paused = true)]
async fn a_killed_address_loses_every_connection_and_cannot_connect() {
    let net = MemNetwork::new();
    let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
    let mut la = net.listen(a).unwrap();
    let mut lb = net.listen(b).unwrap();
    // One connection each way.
    let (mut r_ab, _w_ab, _sr_ab, _sw_ab) = open(&net.endpoint(a), &mut lb, b).await;
    let (_r_ba, _w_ba, mut sr_ba, _sw_ba) = open(&net.endpoint(b), &mut la, a).await;
    net.kill(a);
    let mut buf = [0u8; 1];
    assert_eq!(r_ab.read(&mut buf).await.unwrap(), 0);
    assert_eq!(sr_ba.read(&mut buf).await.unwrap(), 0);
    assert!(net.endpoint(a).connect(b).await.is_err());
    assert!(net.endpoint(b).connect(a).await.is_err());
    assert!(la.accept().await.is_err(), "its listener is closed");
    net.revive(a);
    let mut la = net.listen(a).unwrap();
    let (_r, mut w, mut sr, _sw) = open(&net.endpoint(b), &mut la, a).await;
    w.write_all(b"k").await.unwrap();
    sr.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"k");
    let id = net.connections().last().unwrap().id;
    assert!(net.reset_connection(id));
    assert!(!net.reset_connection(id));
}

#[tokio::test(start_paused = true)]
async fn one_seed_draws_the_same_delays() {
    let draw = |seed| {
        let net = MemNetwork::seeded(seed);
        net.set_delay(Some(Delay {
            min: Duration::from_millis(1),
            max: Duration::from_millis(100),
        }));
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
        let mut st = net.inner.state.lock().unwrap();
        (0..16)
            .map(|_| st.next_delay(a, b).expect("a delay is set"))
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(1), draw(1));
    assert_ne!(draw(1), draw(2));
    assert!(draw(3)
        .iter()
        .all(|d| *d >= Duration::from_millis(1) && *d <= Duration::from_millis(100)));
}
