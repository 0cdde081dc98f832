//! A mount's settings checked together and turned into a plan, before anything is
//! opened or mounted.

use imagefs::mount::{Access, Engine, Transport};
use mountd::Mount;
use mountopts::MountOptions;
use opening::Pin;
use std::path::PathBuf;
use std::time::Duration;

fn mount(options: &str) -> anyhow::Result<Mount> {
    let opts = MountOptions::parse(options.as_bytes()).expect("options parse");
    let images = vec![PathBuf::from("a.img"), PathBuf::from("b.img")];
    let pins = vec![Pin::default(); 2];
    Mount::new(images, "/mnt".into(), pins, opts, true)
}

fn refusal(options: &str) -> String {
    match mount(options) {
        Ok(_) => panic!("{options:?} was taken"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn options_that_cannot_go_together_are_refused_saying_which() {
    for (options, says) in [
        ("upper=/u", "--upper needs --work"),
        ("work=/w", "--work needs --upper"),
        ("rw", "a writable mount needs --upper"),
        ("nocache,cache=/c", "nocache with cache="),
        ("prefetch", "no image is remote"),
        ("allow_other,allow_root", "give one"),
        ("policy=/p", "--policy needs --measure-log"),
        ("measure_log=/m", "--measure-log needs --policy"),
    ] {
        let e = refusal(options);
        assert!(e.contains(says), "{options}: {e}");
    }
}

#[test]
fn every_image_needs_its_pin_and_there_is_at_least_one() {
    let opts = MountOptions::default();
    let e = Mount::new(vec![], "/mnt".into(), vec![], opts.clone(), true).err();
    assert!(format!("{:#}", e.unwrap()).contains("one or more images"));
    let one = vec![PathBuf::from("a.img")];
    assert!(Mount::new(one, "/mnt".into(), vec![], opts, true).is_err());
}

#[test]
fn the_plan_carries_the_options_over() {
    let m =
        mount("engine=fuse,transport=dev,threads=3,nosuid,noexec,allow_other,poll_us=7").unwrap();
    assert_eq!(m.engine, (Engine::Fuse, "asked for".to_string()));
    let p = m.plan("a.img:b.img".into(), Duration::from_secs(5));
    assert_eq!(p.source, "a.img:b.img");
    assert_eq!(p.mountpoint, PathBuf::from("/mnt"));
    assert!(!p.writable);
    assert!(p.flags.nosuid && p.flags.noexec && !p.flags.nodev);
    assert!(matches!(p.access, Access::All));
    assert_eq!(p.threads, 3);
    assert_eq!(p.transport, Transport::Dev);
    assert_eq!(p.poll, Some(Duration::from_micros(7)));
    assert!(p.as_root);
    assert_eq!(p.engine_why, "asked for");
}

#[test]
fn an_upper_directory_makes_the_mount_writable_unless_ro() {
    assert!(mount("upper=/u,work=/w").unwrap().writable());
    assert!(!mount("upper=/u,work=/w,ro").unwrap().writable());
}

#[test]
fn measurement_is_planned_with_its_hash() {
    let m = mount("policy=/p,measure_log=/m,measure_hash=sha512").unwrap();
    let measure = m.measure().unwrap().expect("measurement asked for");
    assert_eq!(measure.policy, PathBuf::from("/p"));
    assert_eq!(measure.list, PathBuf::from("/m"));
    assert_eq!(measure.hash, measure::log::HashAlgo::Sha512);
    assert!(mount("").unwrap().measure().unwrap().is_none());
}

#[test]
fn remote_reads_are_bounded_and_cached_as_asked() {
    let m = mount("nocache").unwrap();
    let r = m.read_opts(Duration::from_secs(60));
    assert!(r.cache.is_none());
    assert_eq!(r.timeout, Duration::from_secs(30));
    let m = mount("cache=/c,cache_size=1G").unwrap();
    let r = m.read_opts(Duration::from_secs(60));
    assert_eq!(r.cache, Some((PathBuf::from("/c"), 1 << 30)));
    assert!(!r.default_cache);
}
