//! Strategy parsing (`STAX_ALLOCATOR`) and construction on backends that cannot run them.

use std::sync::Arc;

use stax_alloc::{
    AllocError, Allocator, Category, HostMemory, RawMemory, SimMemory, Strategy, format_size,
    parse_size,
};

#[test]
fn accepted_forms_parse() {
    let cases = [
        ("caching", Strategy::Caching),
        ("  Caching ", Strategy::Caching),
        ("bfc", Strategy::Bfc { fraction: 0.75 }),
        ("bfc:fraction=0.5", Strategy::Bfc { fraction: 0.5 }),
        ("BFC: fraction = 1", Strategy::Bfc { fraction: 1.0 }),
        ("platform", Strategy::Platform),
        ("expandable", Strategy::Expandable),
        (" Expandable", Strategy::Expandable),
        (
            "async:release_threshold=unlimited",
            Strategy::Async {
                release_threshold: u64::MAX,
            },
        ),
        (
            "async",
            Strategy::Async {
                release_threshold: u64::MAX,
            },
        ),
        (
            "async:release_threshold=1GiB",
            Strategy::Async {
                release_threshold: 1 << 30,
            },
        ),
        (
            "async:release_threshold=1048576",
            Strategy::Async {
                release_threshold: 1 << 20,
            },
        ),
        (
            "async:release_threshold=2GB",
            Strategy::Async {
                release_threshold: 2_000_000_000,
            },
        ),
        (
            "async:release_threshold=1.5 KiB",
            Strategy::Async {
                release_threshold: 1536,
            },
        ),
        (
            "async:release_threshold=0",
            Strategy::Async {
                release_threshold: 0,
            },
        ),
    ];
    for (text, want) in cases {
        let got: Strategy = text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(got, want, "{text:?}");
        // Display round-trips.
        assert_eq!(
            got.to_string().parse::<Strategy>().unwrap(),
            want,
            "{text:?}"
        );
    }
    assert_eq!(Strategy::default(), Strategy::Caching);
    assert_eq!(
        Strategy::Async {
            release_threshold: 1 << 30
        }
        .to_string(),
        "async:release_threshold=1GiB"
    );
    assert_eq!(
        Strategy::Async {
            release_threshold: u64::MAX
        }
        .to_string(),
        "async"
    );
    assert_eq!(Strategy::Platform.to_string(), "platform");
    // What reports print: every parameter in effect, defaults spelled out; it parses back.
    for (s, shown) in [
        (Strategy::Caching, "caching"),
        (Strategy::Expandable, "expandable"),
        (Strategy::Bfc { fraction: 0.75 }, "bfc:fraction=0.75"),
        (
            Strategy::Async {
                release_threshold: u64::MAX,
            },
            "async:release_threshold=unlimited",
        ),
        (
            Strategy::Async {
                release_threshold: 1 << 30,
            },
            "async:release_threshold=1GiB",
        ),
    ] {
        assert_eq!(s.in_effect(), shown);
        assert_eq!(shown.parse::<Strategy>().unwrap(), s);
    }
}

#[test]
fn bad_values_name_the_accepted_forms() {
    for bad in [
        "",
        "bogus",
        "cache",
        "bfc:fraction=0",
        "bfc:fraction=1.5",
        "bfc:fraction=-0.5",
        "bfc:fraction=abc",
        "bfc:fraction=NaN",
        "bfc:size=1",
        "bfc:",
        "bfc:fraction",
        "caching:fraction=0.5",
        "platform:x=1",
        "async:release_threshold=1XB",
        "async:release_threshold=-1",
        "async:release_threshold=GiB",
        "async:release_threshold=99999999999999999999",
        "async:fraction=0.5",
        "expandable:fraction=0.5",
        "expandables",
    ] {
        match bad.parse::<Strategy>() {
            Err(AllocError::InvalidStrategy {
                origin,
                value,
                reason,
            }) => {
                assert_eq!(value, bad);
                assert!(
                    reason.contains("accepted forms: caching | expandable | bfc"),
                    "{bad:?}: {reason}"
                );
                let msg = AllocError::InvalidStrategy {
                    origin,
                    value,
                    reason,
                }
                .to_string();
                assert!(msg.starts_with(&format!("strategy={bad:?}: ")), "{msg}");
            }
            other => panic!("{bad:?} should be rejected, got {other:?}"),
        }
    }
}

#[test]
fn sizes() {
    assert_eq!(parse_size("4096"), Some(4096));
    assert_eq!(parse_size("4KiB"), Some(4096));
    assert_eq!(parse_size("4kb"), Some(4000));
    assert_eq!(parse_size("3 MiB"), Some(3 << 20));
    assert_eq!(parse_size("1MB"), Some(1_000_000));
    assert_eq!(parse_size("2GiB"), Some(2 << 30));
    assert_eq!(parse_size("12B"), Some(12));
    assert_eq!(parse_size("1.5"), None, "a fraction of a byte");
    assert_eq!(parse_size("1.5B"), None, "a fraction of a byte");
    assert_eq!(parse_size("2.0"), Some(2));
    assert_eq!(parse_size("1.5KiB"), Some(1536));
    assert_eq!(parse_size("1..5GiB"), None);
    assert_eq!(parse_size("x"), None);
    assert_eq!(parse_size("20000000000GiB"), None);
    for n in [0, 1, 1000, 1 << 10, 3 << 20, 5 << 30, (1 << 30) + 1] {
        assert_eq!(parse_size(&format_size(n)), Some(n));
    }
}

#[test]
fn from_env_reads_stax_allocator() {
    // SAFETY (for the set_var/remove_var calls below): this is the only test in this binary
    // that touches the environment, and no other thread reads it meanwhile.
    let set = |v: Option<&str>| unsafe {
        match v {
            Some(v) => std::env::set_var("STAX_ALLOCATOR", v),
            None => std::env::remove_var("STAX_ALLOCATOR"),
        }
    };
    set(None);
    assert_eq!(Strategy::from_env().unwrap(), Strategy::Caching);
    set(Some(""));
    assert_eq!(Strategy::from_env().unwrap(), Strategy::Caching);
    set(Some("bfc:fraction=0.25"));
    assert_eq!(
        Strategy::from_env().unwrap(),
        Strategy::Bfc { fraction: 0.25 }
    );
    set(Some("nonsense"));
    let e = Strategy::from_env().unwrap_err();
    assert!(
        e.to_string().contains("unknown strategy \"nonsense\""),
        "{e}"
    );
    set(None);
}

#[test]
fn async_needs_a_stream_ordered_backend() {
    let plain = Arc::new(SimMemory::new(1 << 30, 2 << 20));
    match Allocator::new(
        plain,
        Strategy::Async {
            release_threshold: 0,
        },
    ) {
        Err(AllocError::Unsupported {
            strategy,
            backend,
            reason,
        }) => {
            assert_eq!(
                (strategy.as_str(), backend.as_str()),
                ("async:release_threshold=0", "sim")
            );
            assert!(reason.contains("stream-ordered"));
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let pool = Arc::new(SimMemory::new(1 << 30, 2 << 20).with_stream_ordered(true));
    let alloc = Allocator::new(
        pool.clone(),
        "async:release_threshold=1GiB".parse().unwrap(),
    )
    .unwrap();
    assert_eq!(pool.release_threshold(), Some(1 << 30));
    let a = alloc.allocate(1000, Category::Workspace).unwrap();
    assert_eq!((pool.reserve_calls(), alloc.stats().requested), (1, 1000));
    drop(a);
    assert_eq!(pool.release_calls(), 1);
    alloc.empty_cache().unwrap();
    assert_eq!(pool.trim_calls(), 1);
}

/// `bfc:fraction=F` is F x the device's *total* memory, as JAX's
/// `XLA_PYTHON_CLIENT_MEM_FRACTION`; when that much is not free (a second process holds
/// memory) the allocator refuses to start, naming both figures, instead of reserving less.
#[test]
fn bfc_fraction_is_of_the_total_and_refuses_what_is_not_free() {
    let sim = Arc::new(SimMemory::new(1 << 30, 2 << 20));
    // Another process holds 400 MiB of the 1 GiB device.
    let other = sim.reserve(400 << 20).unwrap();
    let alloc = Allocator::new(sim.clone(), Strategy::Bfc { fraction: 0.5 }).unwrap();
    assert_eq!(
        alloc.stats().reserved,
        512 << 20,
        "0.5 of the total, not of the free 624 MiB"
    );
    drop(alloc);
    let e = Allocator::new(sim.clone(), Strategy::Bfc { fraction: 0.75 }).unwrap_err();
    assert_eq!(
        e.to_string(),
        "allocator: bfc:fraction=0.75 wants an arena of 805.31 MB (805,306,368 bytes) (0.75 \
         of the 1.07 GB (1,073,741,824 bytes) total) but sim has only 654.31 MB (654,311,424 \
         bytes) free: lower the fraction or free the memory held elsewhere (another process \
         on the same device?)"
    );
    match e {
        AllocError::ArenaUnavailable {
            strategy,
            backend,
            fraction,
            requested,
            free,
            total,
        } => {
            assert_eq!(
                (strategy.as_str(), backend.as_str()),
                ("bfc:fraction=0.75", "sim")
            );
            assert_eq!(fraction, 0.75);
            assert_eq!((requested, free, total), (768 << 20, 624 << 20, 1 << 30));
        }
        other => panic!("expected ArenaUnavailable, got {other:?}"),
    }
    assert_eq!(
        sim.outstanding(),
        vec![other],
        "nothing was reserved by the failed start"
    );
    sim.release(other).unwrap();
    let alloc = Allocator::new(sim, Strategy::Bfc { fraction: 0.75 }).unwrap();
    assert_eq!(alloc.stats().reserved, 768 << 20);
}

#[test]
fn bfc_needs_a_size_figure() {
    let e =
        Allocator::new(Arc::new(HostMemory::new()), Strategy::Bfc { fraction: 0.5 }).unwrap_err();
    assert!(matches!(e, AllocError::Unsupported { .. }), "{e}");
    // A fraction smaller than one granule is refused too.
    let sim = Arc::new(SimMemory::new(4 << 20, 2 << 20));
    let e = Allocator::new(sim.clone(), Strategy::Bfc { fraction: 0.1 }).unwrap_err();
    assert!(e.to_string().contains("less than one"), "{e}");
    assert!(sim.outstanding().is_empty());
}
