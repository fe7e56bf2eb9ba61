//! TLS on the TCP links (`RUSTCCL_TLS`): groups over two simulated hosts
//! (shared memory within, TLS between) and over TCP only, in both ways of
//! authenticating; and every hostile or mistaken peer failing every rank
//! with an error that names TLS and the peer. Certificates are made here,
//! at test time, so they never expire.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustccl::bootstrap::MemStore;
use rustccl::comm::CommOptions;
use rustccl::config::{AlgoConfig, TransportMode};
use rustccl::error::Result;
use rustccl::tls::{Socket, Tls, TlsMode};
use rustccl::{Communicator, DType, OpKind};

use crate::common::{buf, on_ranks, opts, read, recv, send, spec, t};

/// Ranks on `hosts[r]`, each with the TLS of `tls(r)`; every rank's result.
fn bootstrap(hosts: &[usize], transport: TransportMode, tls: impl Fn(usize) -> Option<TlsMode> + Sync) -> Vec<Result<Communicator>> {
    let n = hosts.len();
    let store = Arc::new(MemStore::new());
    let tls = &tls;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let store = store.clone();
                s.spawn(move || {
                    let mut o: CommOptions = opts(Duration::from_secs(20), AlgoConfig::default());
                    o.transport = transport;
                    o.host_id = Some(format!("host{}", hosts[r]));
                    o.tls = tls(r).map(|m| Arc::new(Tls::load(m, &o.group).unwrap()));
                    Communicator::bootstrap(store.as_ref(), r, n, o, "127.0.0.1".parse().unwrap())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn secret(dir: &Path, name: &str, bytes: &[u8]) -> TlsMode {
    let file = dir.join(name);
    std::fs::write(&file, bytes).unwrap();
    TlsMode::Secret { file }
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rustccl-tls-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every collective path that crosses the TCP links, with data checked:
/// small and large all_reduce (large ones wrap the sessions' buffers),
/// broadcast, and point-to-point both ways.
fn exercise(comms: &[Communicator]) {
    let n = comms.len();
    on_ranks(comms, |r, c| {
        for len in [3usize, 1 << 21] {
            let b = buf(DType::F32, &(0..len).map(|i| ((r * 7 + i) % 13) as f64).collect::<Vec<_>>());
            let mut s = spec(OpKind::AllReduce);
            s.inputs = vec![t(&b)];
            c.submit(vec![s], None, None).unwrap().wait(None).unwrap();
            let want: Vec<f64> = (0..len).map(|i| (0..n).map(|q| ((q * 7 + i) % 13) as f64).sum()).collect();
            assert_eq!(read(DType::F32, &b), want, "all_reduce of {len} on rank {r}");
        }
        let b = buf(DType::I64, &vec![if r == 1 { 42.0 } else { 0.0 }; 100_000]);
        let mut s = spec(OpKind::Broadcast);
        s.root = 1;
        s.inputs = vec![t(&b)];
        c.submit(vec![s], None, None).unwrap().wait(None).unwrap();
        assert_eq!(read(DType::I64, &b), vec![42.0; 100_000]);
        // a ring of sends: each rank to the next, 4 MiB
        let out = buf(DType::F32, &vec![r as f64; 1 << 20]);
        let inc = buf(DType::F32, &vec![-1.0; 1 << 20]);
        let sw = send(c, &out, (r + 1) % n, 7);
        recv(c, &inc, Some((r + n - 1) % n), 7).wait(None).unwrap();
        sw.wait(None).unwrap();
        assert_eq!(read(DType::F32, &inc), vec![((r + n - 1) % n) as f64; 1 << 20]);
    });
}

#[test]
fn a_shared_secret_encrypts_the_links_between_hosts_and_every_op_works() {
    let d = tmpdir("secret");
    let mode = secret(&d, "s", b"a secret of the job, 32 bytes...");
    for (hosts, transport) in [(vec![0, 0, 1, 1], TransportMode::Auto), (vec![0, 0, 0], TransportMode::Tcp)] {
        let comms: Vec<Communicator> = bootstrap(&hosts, transport, |_| Some(mode.clone())).into_iter().map(|c| c.unwrap()).collect();
        for (r, c) in comms.iter().enumerate() {
            for (p, kind) in c.link_kinds().iter().enumerate() {
                let want = if p == r {
                    ""
                } else if hosts[p] == hosts[r] && transport == TransportMode::Auto {
                    "shm"
                } else {
                    "tls"
                };
                assert_eq!(*kind, want, "rank {r} to rank {p}");
            }
        }
        exercise(&comms);
    }
}

#[test]
fn certificates_from_one_ca_encrypt_the_links_and_every_op_works() {
    let d = tmpdir("certs");
    let ca = Ca::new("ca");
    let modes: Vec<TlsMode> = (0..3).map(|r| ca.issue(&d, &format!("rank{r}"), false)).collect();
    let comms: Vec<Communicator> =
        bootstrap(&[0, 1, 2], TransportMode::Auto, |r| Some(modes[r].clone())).into_iter().map(|c| c.unwrap()).collect();
    exercise(&comms);
}

/// What every rank of a group that cannot form says: all fail, each
/// naming rustccl and, where it saw the handshake fail, TLS and the peer.
fn all_fail(results: Vec<Result<Communicator>>, needle: &[&str]) {
    for (r, res) in results.into_iter().enumerate() {
        let e = res.err().unwrap_or_else(|| panic!("rank {r} formed a group it should not have"));
        let s = e.to_string();
        assert!(s.contains("rustccl"), "rank {r}: {s}");
        assert!(needle.iter().any(|n| s.contains(n)), "rank {r}: {s}");
    }
}

#[test]
fn a_peer_with_another_secret_is_refused_on_every_rank() {
    let d = tmpdir("wrong");
    let (good, bad) = (secret(&d, "good", b"the job's secret, 32 bytes......"), secret(&d, "bad", b"someone else's secret, 32 bytes."));
    let res = bootstrap(&[0, 1], TransportMode::Auto, |r| Some(if r == 1 { bad.clone() } else { good.clone() }));
    all_fail(res, &["TLS with rank"]);
}

#[test]
fn a_plain_rank_among_tls_ranks_fails_every_rank_before_any_handshake() {
    let d = tmpdir("plain");
    let mode = secret(&d, "s", b"the job's secret, 32 bytes......");
    let t0 = Instant::now();
    let res = bootstrap(&[0, 1, 2], TransportMode::Auto, |r| (r != 2).then(|| mode.clone()));
    all_fail(res, &["does not use TLS", "uses TLS"]);
    assert!(t0.elapsed() < Duration::from_secs(15), "the ranks waited for the timeout");
}

#[test]
fn certificates_of_another_ca_or_expired_are_refused() {
    let d = tmpdir("badcerts");
    let (ca, other) = (Ca::new("ca"), Ca::new("other"));
    let good = ca.issue(&d, "good", false);
    for (name, bad, needle) in [
        ("stranger", other.issue(&d, "stranger", false), "UnknownIssuer"),
        ("expired", ca.issue(&d, "expired", true), "certificate expired"),
    ] {
        let res = bootstrap(&[0, 1], TransportMode::Auto, |r| Some(if r == 1 { bad.clone() } else { good.clone() }));
        // the rank that checked the bad certificate names why; its peer
        // learns it from the alert
        let errs: Vec<String> = res.into_iter().map(|c| c.err().map(|e| e.to_string()).unwrap_or_default()).collect();
        assert!(errs.iter().all(|e| e.contains("TLS with rank")), "{name}: {errs:?}");
        assert!(errs.iter().any(|e| e.contains(needle)), "{name}: {errs:?}");
    }
}

/// A man in the middle that flips one byte of the stream after the
/// handshake: the receiver's record layer refuses the record, with an
/// error that says so.
#[test]
fn a_flipped_byte_on_the_wire_fails_the_read_with_the_cause() {
    let d = tmpdir("mitm");
    let tls = Tls::load(secret(&d, "s", b"the job's secret, 32 bytes......"), "g").unwrap();
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let (saddr, paddr) = (server.local_addr().unwrap(), proxy.local_addr().unwrap());
    // forwards both ways; flips one byte of the client's stream once the
    // handshake is well past
    std::thread::spawn(move || {
        let (a, _) = proxy.accept().unwrap();
        let b = TcpStream::connect(saddr).unwrap();
        let (mut a2, mut b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = b2.read(&mut buf) {
                if n == 0 || a2.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
        let (mut a, mut b) = (a, b);
        let (mut buf, mut seen) = ([0u8; 4096], 0usize);
        while let Ok(n) = a.read(&mut buf) {
            if n == 0 {
                break;
            }
            assert!(!buf[..n].windows(64).any(|w| w.iter().all(|&b| b == 7)), "plaintext crossed the wire");
            if seen < 20_000 && seen + n >= 20_000 {
                buf[20_000 - seen] ^= 0x40;
            }
            seen += n;
            if b.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let tls = &tls;
    let (got, sent) = std::thread::scope(|s| {
        let srv = s.spawn(move || {
            let (mut st, _) = server.accept().unwrap();
            let session = tls.handshake(&mut st, false, deadline).unwrap();
            st.set_nonblocking(true).unwrap();
            let mut sock = Socket::new(mio::net::TcpStream::from_std(st), Some(session));
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match sock.read(&mut buf) {
                    Ok(0) => return Ok(()),
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                    Err(e) => return Err(e),
                }
                if Instant::now() > deadline {
                    panic!("the flipped byte was never noticed");
                }
            }
        });
        let mut st = TcpStream::connect(paddr).unwrap();
        let session = tls.handshake(&mut st, true, deadline).unwrap();
        st.set_nonblocking(true).unwrap();
        let mut sock = Socket::new(mio::net::TcpStream::from_std(st), Some(session));
        let data = vec![7u8; 100_000];
        let mut off = 0;
        while off < data.len() || !sock.flushed().unwrap_or(true) {
            match sock.write_vectored(&[std::io::IoSlice::new(&data[off..])]) {
                Ok(k) => off += k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                Err(_) => break,
            }
        }
        (srv.join().unwrap(), off)
    });
    assert!(sent > 20_000, "the client sent only {sent} bytes");
    let e = got.expect_err("a tampered record was taken");
    assert!(e.to_string().contains("failed authentication"), "{e}");
}

/// A test CA (rcgen), issuing rank certificates into PEM files.
struct Ca {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, format!("rustccl test {name}"));
        let pem = params.self_signed(&key).unwrap().pem();
        Ca { params, key, pem }
    }

    /// A certificate for `name` (expired: valid only in the past) and its
    /// key, with this CA's certificate, as the settings name them.
    fn issue(&self, dir: &Path, name: &str, expired: bool) -> TlsMode {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["rank.example".to_string()]).unwrap();
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let (ca, c, k) = (dir.join(format!("{name}-ca.pem")), dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
        std::fs::write(&ca, &self.pem).unwrap();
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        TlsMode::Certs { ca, cert: c, key: k }
    }
}

/// Groups made from an encrypted group (split, shrink) are encrypted too,
/// and work.
#[test]
fn split_and_shrunk_groups_keep_tls() {
    let d = tmpdir("children");
    let mode = secret(&d, "s", b"the job's secret, 32 bytes......");
    let comms: Vec<Communicator> =
        bootstrap(&[0, 1, 2], TransportMode::Auto, |_| Some(mode.clone())).into_iter().map(|c| c.unwrap()).collect();
    on_ranks(&comms, |r, c| {
        let child = c.split(&[0, 2], "pair", Duration::from_secs(20)).unwrap();
        let shrunk = c.shrink(&[1], false, Duration::from_secs(20));
        if r == 1 {
            assert!(child.is_none());
            return;
        }
        for g in [child.unwrap(), shrunk.unwrap()] {
            assert!(g.link_kinds().iter().all(|k| k.is_empty() || *k == "tls"), "{:?}", g.link_kinds());
            let b = buf(DType::F32, &vec![r as f64; 1 << 16]);
            let mut s = spec(OpKind::AllReduce);
            s.inputs = vec![t(&b)];
            g.submit(vec![s], None, None).unwrap().wait(None).unwrap();
            assert_eq!(read(DType::F32, &b), vec![2.0; 1 << 16]);
        }
    });
}
