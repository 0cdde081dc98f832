//! A hostile policy file must parse or be refused with its line, never panic, and never
//! take memory beyond the file's (bounded) size. What parses must print back to itself
//! (the canonical form `Display` promises) and decide any access without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use measure::policy::{
    Access, FsIdentity, Func, Policy, TaskIds, MAY_APPEND, MAY_EXEC, MAY_READ, MAY_WRITE,
};

fuzz_target!(|data: &[u8]| {
    let Ok(policy) = Policy::parse_bytes(data) else {
        return;
    };
    let text = policy.to_string();
    assert_eq!(Policy::parse(&text).as_ref(), Ok(&policy), "{text}");
    let _ = policy.pcrs();
    // The identities verilay reports: an image layer, a host filesystem, and one whose
    // magic is 0 (seed 0's CephFS).
    let layers = [
        FsIdentity {
            magic: 0xe0f5_e1e2,
            name: "erofs".into(),
            uuid: [7; 16],
        },
        FsIdentity {
            magic: 0xef53,
            name: "ext4".into(),
            uuid: [0x5b; 16],
        },
        FsIdentity {
            magic: 0,
            name: String::new(),
            uuid: [0; 16],
        },
    ];
    for fs in &layers {
        let _ = policy.may_measure(fs);
        for func in [Func::FileCheck, Func::BprmCheck] {
            for mask in [MAY_READ, MAY_WRITE, MAY_READ | MAY_WRITE | MAY_APPEND, MAY_EXEC] {
                for (fowner, uid) in [(0, 0), (1000, 1000), (u32::MAX - 1, 0)] {
                    let access = Access {
                        func,
                        mask,
                        fowner,
                        fgroup: fowner,
                        fs,
                    };
                    let mut task = || TaskIds {
                        uid,
                        euid: 0,
                        suid: uid,
                        gid: uid,
                        egid: 0,
                        sgid: uid,
                        cap_setuid: uid == 0,
                        cap_setgid: false,
                    };
                    let _ = policy.decide(&access, &mut task);
                }
            }
        }
    }
});
