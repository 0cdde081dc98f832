//! The IMA policy parser and matcher: syntax, refusals with their exact messages, and the
//! kernel's matching rules.

use measure::policy::{
    Access, FsIdentity, Func, Measure, Policy, TaskIds, Template, MAY_APPEND, MAY_EXEC, MAY_READ,
    MAY_WRITE,
};

const EROFS: u64 = 0xe0f5_e1e2;
const CEPH: u64 = 0x00c3_6400;
const UUID: [u8; 16] = [
    0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
];
const UUID_TEXT: &str = "12345678-9abc-def0-0123-456789abcdef";

fn fs(magic: u64, name: &str, uuid: [u8; 16]) -> FsIdentity {
    FsIdentity {
        magic,
        name: name.to_owned(),
        uuid,
    }
}

fn erofs() -> FsIdentity {
    fs(EROFS, "erofs", UUID)
}

fn ids(uid: u32, euid: u32, suid: u32) -> TaskIds {
    TaskIds {
        uid,
        euid,
        suid,
        gid: uid,
        egid: euid,
        sgid: suid,
        ..TaskIds::default()
    }
}

fn user(id: u32) -> TaskIds {
    ids(id, id, id)
}

fn parse(text: &str) -> Policy {
    match Policy::parse(text) {
        Ok(p) => p,
        Err(e) => panic!("{text:?} should parse: {e}"),
    }
}

/// The error's Display form, which carries the line number and the message.
fn error(text: &str) -> String {
    match Policy::parse(text) {
        Ok(p) => panic!("{text:?} should not parse, got {p}"),
        Err(e) => e.to_string(),
    }
}

/// The decision and how many times the task's ids were asked for.
fn decide_full(
    p: &Policy,
    func: Func,
    mask: u32,
    f: &FsIdentity,
    owner: (u32, u32),
    t: TaskIds,
) -> (Option<Measure>, usize) {
    let mut calls = 0;
    let access = Access {
        func,
        mask,
        fowner: owner.0,
        fgroup: owner.1,
        fs: f,
    };
    let got = p.decide(&access, &mut || {
        calls += 1;
        t
    });
    (got, calls)
}

fn decide(p: &Policy, func: Func, mask: u32, t: TaskIds) -> Option<Measure> {
    decide_full(p, func, mask, &erofs(), (0, 0), t).0
}

fn measured(p: &Policy, func: Func, mask: u32, t: TaskIds) -> bool {
    decide(p, func, mask, t).is_some()
}

const DEFAULT: Measure = Measure {
    pcr: 10,
    template: Template::ImaNg,
    verity: false,
};

// ---- syntax -------------------------------------------------------------------------

#[test]
fn every_supported_keyword_parses_and_prints_canonically() {
    let cases = [
        ("measure", "measure"),
        ("dont_measure", "dont_measure"),
        ("measure func=FILE_CHECK", "measure func=FILE_CHECK"),
        ("measure func=PATH_CHECK", "measure func=FILE_CHECK"),
        ("measure func=BPRM_CHECK", "measure func=BPRM_CHECK"),
        ("measure mask=MAY_EXEC", "measure mask=MAY_EXEC"),
        ("measure mask=MAY_WRITE", "measure mask=MAY_WRITE"),
        ("measure mask=MAY_READ", "measure mask=MAY_READ"),
        ("measure mask=MAY_APPEND", "measure mask=MAY_APPEND"),
        ("measure mask=^MAY_EXEC", "measure mask=^MAY_EXEC"),
        ("measure mask=^MAY_WRITE", "measure mask=^MAY_WRITE"),
        ("measure mask=^MAY_READ", "measure mask=^MAY_READ"),
        ("measure mask=^MAY_APPEND", "measure mask=^MAY_APPEND"),
        ("measure uid=0", "measure uid=0"),
        ("measure uid<1000", "measure uid<1000"),
        ("measure uid>1000", "measure uid>1000"),
        ("measure euid=0", "measure euid=0"),
        ("measure euid<7", "measure euid<7"),
        ("measure euid>7", "measure euid>7"),
        ("measure gid=5", "measure gid=5"),
        ("measure gid<5", "measure gid<5"),
        ("measure gid>5", "measure gid>5"),
        ("measure egid=6", "measure egid=6"),
        ("measure egid<6", "measure egid<6"),
        ("measure egid>6", "measure egid>6"),
        ("measure fowner=1", "measure fowner=1"),
        ("measure fowner<1", "measure fowner<1"),
        ("measure fowner>1", "measure fowner>1"),
        ("measure fgroup=2", "measure fgroup=2"),
        ("measure fgroup<2", "measure fgroup<2"),
        ("measure fgroup>2", "measure fgroup>2"),
        ("measure uid=4294967294", "measure uid=4294967294"),
        ("measure uid=+007", "measure uid=7"),
        ("measure fsmagic=0xE0F5E1E2", "measure fsmagic=0xe0f5e1e2"),
        ("measure fsmagic=e0f5e1e2", "measure fsmagic=0xe0f5e1e2"),
        ("measure fsmagic=0X1", "measure fsmagic=0x1"),
        ("measure fsmagic=0", "measure fsmagic=0x0"),
        ("measure fsmagic=ffffffffffffffff", "measure fsmagic=0xffffffffffffffff"),
        ("measure fsname=fuse", "measure fsname=fuse"),
        ("measure fsuuid=12345678-9ABC-DEF0-0123-456789ABCDEF", "measure fsuuid=12345678-9abc-def0-0123-456789abcdef"),
        ("measure pcr=0", "measure pcr=0"),
        ("measure pcr=23", "measure pcr=23"),
        ("measure template=ima-ng", "measure template=ima-ng"),
        ("measure template=ima-ngv2", "measure template=ima-ngv2"),
        ("measure template=ima-sig", "measure template=ima-sig"),
        ("measure template=ima-sigv2", "measure template=ima-sigv2"),
        // lookup_template_desc() also finds a template by its format string.
        ("measure template=d-ngv2|n-ng|sig", "measure template=ima-sigv2"),
        ("measure digest_type=verity", "measure digest_type=verity"),
        ("measure permit_directio", "measure permit_directio"),
        ("dont_measure permit_directio", "dont_measure permit_directio"),
        // Tokens in any order (but template= after the action), printed in the
        // kernel's order; tabs and runs of blanks separate tokens.
        (
            "\t permit_directio  digest_type=verity egid>3 fowner<9 uid=0\tfsname=erofs measure template=ima-sigv2 fgroup=4 pcr=11 fsuuid=12345678-9abc-def0-0123-456789abcdef fsmagic=e0f5e1e2 mask=^MAY_READ func=FILE_CHECK  ",
            "measure func=FILE_CHECK mask=^MAY_READ fsmagic=0xe0f5e1e2 fsname=erofs pcr=11 fsuuid=12345678-9abc-def0-0123-456789abcdef uid=0 egid>3 fowner<9 fgroup=4 template=ima-sigv2 digest_type=verity permit_directio",
        ),
        // fsname= and pcr= repeats: the last one counts.
        ("measure fsname=a fsname=b pcr=1 pcr=2", "measure fsname=b pcr=2"),
        // digest_type=verity twice is the same flag twice.
        ("measure digest_type=verity digest_type=verity", "measure digest_type=verity"),
        // '#' inside a token is part of it.
        ("measure fsname=a#b", "measure fsname=a#b"),
    ];
    for (text, canonical) in cases {
        let p = parse(text);
        assert_eq!(p.len(), 1, "{text}");
        assert_eq!(p.to_string(), format!("{canonical}\n"), "{text}");
    }
}

#[test]
fn comments_and_blank_lines() {
    let text = "# a policy\n\n   \t\n  # indented comment\nmeasure func=BPRM_CHECK # exec'd files\n\ndont_measure fsname=tmpfs #\nmeasure #func=FILE_CHECK\n";
    let p = parse(text);
    assert_eq!(p.len(), 3);
    assert!(!p.is_empty());
    assert_eq!(
        p.to_string(),
        "measure func=BPRM_CHECK\ndont_measure fsname=tmpfs\nmeasure\n"
    );
    // Line numbers count comments and blank lines.
    assert_eq!(
        error("# one\n\nmeasure\n   # four\nmeasure bogus # five\n"),
        "line 5: `bogus`: unknown token"
    );
}

#[test]
fn empty_policy() {
    for text in ["", "\n", "# nothing\n\n  \t \n", "#"] {
        let p = parse(text);
        assert!(p.is_empty(), "{text:?}");
        assert_eq!(p.len(), 0);
        assert_eq!(p.to_string(), "");
        assert_eq!(decide(&p, Func::FileCheck, MAY_READ, user(0)), None);
        assert!(!p.may_measure(&erofs()));
    }
}

#[test]
fn template_accessors() {
    let all = [
        (Template::ImaNg, "ima-ng", false, false),
        (Template::ImaNgV2, "ima-ngv2", false, true),
        (Template::ImaSig, "ima-sig", true, false),
        (Template::ImaSigV2, "ima-sigv2", true, true),
    ];
    for (t, name, sig, v2) in all {
        assert_eq!(t.name(), name);
        assert_eq!(t.has_sig(), sig, "{name}");
        assert_eq!(t.is_v2(), v2, "{name}");
    }
}

// ---- refusals and errors: one assert per message ------------------------------------

#[test]
fn refused_actions() {
    assert_eq!(
        error("appraise"),
        "line 1: `appraise`: verilay measures; it does not appraise"
    );
    assert_eq!(
        error("dont_appraise fsmagic=0x9fa0"),
        "line 1: `dont_appraise`: verilay measures; it does not appraise"
    );
    assert_eq!(
        error("audit func=BPRM_CHECK"),
        "line 1: `audit`: verilay measures; it does not audit"
    );
    assert_eq!(
        error("hash"),
        "line 1: `hash`: verilay measures; it does not hash"
    );
    assert_eq!(
        error("\ndont_hash"),
        "line 2: `dont_hash`: verilay measures; it does not hash"
    );
}

#[test]
fn action_errors() {
    assert_eq!(
        error("measure func=FILE_CHECK dont_measure"),
        "line 1: `dont_measure`: a rule has exactly one action"
    );
    assert_eq!(
        error("measure measure"),
        "line 1: `measure`: a rule has exactly one action"
    );
    assert_eq!(
        error("measure\nfunc=FILE_CHECK uid=0"),
        "line 2: no action: a rule needs `measure` or `dont_measure`"
    );
    assert_eq!(
        error("permit_directio # no action"),
        "line 1: no action: a rule needs `measure` or `dont_measure`"
    );
}

#[test]
fn unknown_tokens_and_empty_values() {
    assert_eq!(error("measure bogus"), "line 1: `bogus`: unknown token");
    assert_eq!(error("MEASURE"), "line 1: `MEASURE`: unknown token");
    assert_eq!(error("measure uid!=0"), "line 1: `uid!=0`: unknown token");
    assert_eq!(
        error("measure measure=1"),
        "line 1: `measure=1`: unknown token"
    );
    assert_eq!(error("measure func"), "line 1: `func`: unknown token");
    assert_eq!(
        error("measure func=FILE_CHECK#x"),
        "line 1: `func=FILE_CHECK#x`: unknown func"
    );
    // A CR is no separator in the kernel either; the message shows it.
    assert_eq!(error("measure\r\n"), "line 1: `measure\\r`: unknown token");
    assert_eq!(error("measure func="), "line 1: `func=`: empty value");
    assert_eq!(error("measure fsname="), "line 1: `fsname=`: empty value");
    assert_eq!(error("measure uid="), "line 1: `uid=`: empty value");
    assert_eq!(error("measure fgroup<"), "line 1: `fgroup<`: empty value");
}

#[test]
fn func_errors() {
    for mmap in ["MMAP_CHECK", "FILE_MMAP", "MMAP_CHECK_REQPROT"] {
        assert_eq!(
            error(&format!("measure func={mmap}")),
            format!("line 1: `func={mmap}`: a FUSE filesystem does not see mmap")
        );
    }
    for other in [
        "CREDS_CHECK",
        "MODULE_CHECK",
        "FIRMWARE_CHECK",
        "KEXEC_KERNEL_CHECK",
        "KEXEC_INITRAMFS_CHECK",
        "POLICY_CHECK",
        "KEXEC_CMDLINE",
        "KEY_CHECK",
        "CRITICAL_DATA",
        "SETXATTR_CHECK",
    ] {
        assert_eq!(
            error(&format!("measure func={other}")),
            format!("line 1: `func={other}`: not a file open or exec")
        );
    }
    assert_eq!(
        error("measure func=file_check"),
        "line 1: `func=file_check`: unknown func"
    );
    assert_eq!(
        error("measure func=POST_SETATTR"),
        "line 1: `func=POST_SETATTR`: unknown func"
    );
    assert_eq!(
        error("measure func=FILE_CHECK func=FILE_CHECK"),
        "line 1: `func=FILE_CHECK`: func repeated: one func per rule"
    );
}

#[test]
fn mask_errors() {
    let unknown =
        "unknown mask (MAY_EXEC, MAY_WRITE, MAY_READ or MAY_APPEND, optionally prefixed ^)";
    assert_eq!(
        error("measure mask=MAY_FOO"),
        format!("line 1: `mask=MAY_FOO`: {unknown}")
    );
    assert_eq!(
        error("measure mask=^"),
        format!("line 1: `mask=^`: {unknown}")
    );
    assert_eq!(
        error("measure mask=^^MAY_READ"),
        format!("line 1: `mask=^^MAY_READ`: {unknown}")
    );
    assert_eq!(
        error("measure mask=may_read"),
        format!("line 1: `mask=may_read`: {unknown}")
    );
    assert_eq!(
        error("measure mask=MAY_READ mask=^MAY_WRITE"),
        "line 1: `mask=^MAY_WRITE`: mask repeated: one mask per rule"
    );
}

#[test]
fn id_errors() {
    assert_eq!(
        error("measure uid=0 euid=0"),
        "line 1: `euid=0`: uid and euid share one condition per rule"
    );
    assert_eq!(
        error("measure euid>5 uid<9"),
        "line 1: `uid<9`: uid and euid share one condition per rule"
    );
    assert_eq!(
        error("measure uid=1 uid=1"),
        "line 1: `uid=1`: uid and euid share one condition per rule"
    );
    assert_eq!(
        error("measure gid=0 egid=0"),
        "line 1: `egid=0`: gid and egid share one condition per rule"
    );
    assert_eq!(
        error("measure egid=0 egid>0"),
        "line 1: `egid>0`: gid and egid share one condition per rule"
    );
    assert_eq!(
        error("measure fowner=0 fowner>3"),
        "line 1: `fowner>3`: fowner repeated: one fowner condition per rule"
    );
    assert_eq!(
        error("measure fgroup<1 fgroup=0"),
        "line 1: `fgroup=0`: fgroup repeated: one fgroup condition per rule"
    );
    // uid and gid have separate slots; so do fowner and fgroup.
    assert_eq!(parse("measure uid=0 gid=0 fowner=0 fgroup=0").len(), 1);

    assert_eq!(
        error("measure uid=abc"),
        "line 1: `uid=abc`: not a decimal id"
    );
    assert_eq!(
        error("measure euid=-1"),
        "line 1: `euid=-1`: not a decimal id"
    );
    assert_eq!(
        error("measure gid=0x10"),
        "line 1: `gid=0x10`: not a decimal id"
    );
    assert_eq!(error("measure fowner=1 2"), "line 1: `2`: unknown token");
    let range = "id out of range (0-4294967294; 4294967295 is the invalid id)";
    assert_eq!(
        error("measure uid=4294967296"),
        format!("line 1: `uid=4294967296`: {range}")
    );
    assert_eq!(
        error("measure egid<4294967295"),
        format!("line 1: `egid<4294967295`: {range}")
    );
    assert_eq!(
        error("measure fgroup>99999999999999999999999"),
        format!("line 1: `fgroup>99999999999999999999999`: {range}")
    );
}

#[test]
fn fs_errors() {
    assert_eq!(
        error("measure fsmagic=xyz"),
        "line 1: `fsmagic=xyz`: not a hex number"
    );
    assert_eq!(
        error("measure fsmagic=0x"),
        "line 1: `fsmagic=0x`: not a hex number"
    );
    assert_eq!(
        error("measure fsmagic=-1"),
        "line 1: `fsmagic=-1`: not a hex number"
    );
    assert_eq!(
        error("measure fsmagic=0x10000000000000000"),
        "line 1: `fsmagic=0x10000000000000000`: does not fit in 64 bits"
    );
    assert_eq!(
        error("measure fsmagic=0 fsmagic=0"),
        "line 1: `fsmagic=0`: fsmagic repeated: one fsmagic per rule"
    );
    let bad_uuid = "not a UUID (8-4-4-4-12 hex digits)";
    for uuid in [
        "12345678-9abc-def0-0123-456789abcde",
        "12345678-9abc-def0-0123-456789abcdef0",
        "123456789-abc-def0-0123-456789abcdef",
        "12345678-9abc-def0-0123-456789abcdeg",
        "123456789abcdef00123456789abcdef",
        "12345678-9abc-def0-0123-456789abcdé",
    ] {
        assert_eq!(
            error(&format!("measure fsuuid={uuid}")),
            format!("line 1: `fsuuid={uuid}`: {bad_uuid}")
        );
    }
    assert_eq!(
        error(&format!("measure fsuuid={UUID_TEXT} fsuuid={UUID_TEXT}")),
        format!("line 1: `fsuuid={UUID_TEXT}`: fsuuid repeated: one fsuuid per rule")
    );
}

#[test]
fn pcr_errors() {
    assert_eq!(
        error("measure pcr=abc"),
        "line 1: `pcr=abc`: not a decimal number"
    );
    assert_eq!(
        error("measure pcr=1.5"),
        "line 1: `pcr=1.5`: not a decimal number"
    );
    assert_eq!(
        error("measure pcr=24"),
        "line 1: `pcr=24`: a TPM has 24 PCRs (0-23)"
    );
    assert_eq!(
        error("measure pcr=-1"),
        "line 1: `pcr=-1`: a TPM has 24 PCRs (0-23)"
    );
    assert_eq!(
        error("measure pcr=99999999999999999999999"),
        "line 1: `pcr=99999999999999999999999`: a TPM has 24 PCRs (0-23)"
    );
    assert_eq!(
        error("dont_measure pcr=11"),
        "line 1: `pcr=11`: pcr= is only for measure rules"
    );
    // Checked once the rule is complete, as ima_validate_rule does: order does not matter.
    assert_eq!(
        error("pcr=11 dont_measure"),
        "line 1: `pcr=11`: pcr= is only for measure rules"
    );
}

#[test]
fn template_errors() {
    assert_eq!(
        error("dont_measure template=ima-ng"),
        "line 1: `template=ima-ng`: template= is only for measure rules"
    );
    // The kernel checks the action when it reads template=.
    assert_eq!(
        error("template=ima-ng measure"),
        "line 1: `template=ima-ng`: template= must follow the measure action"
    );
    assert_eq!(
        error("measure template=ima-foo"),
        "line 1: `template=ima-foo`: unknown template"
    );
    assert_eq!(
        error("measure template=ima"),
        "line 1: `template=ima`: the original ima template (SHA-1 without an algorithm name) is not supported; use ima-ng"
    );
    assert_eq!(
        error("measure template=d|n"),
        "line 1: `template=d|n`: the original ima template (SHA-1 without an algorithm name) is not supported; use ima-ng"
    );
    assert_eq!(
        error("measure template=ima-buf"),
        "line 1: `template=ima-buf`: ima-buf records buffers, not files"
    );
    assert_eq!(
        error("measure template=ima-modsig"),
        "line 1: `template=ima-modsig`: ima-modsig records appended signatures, which verilay does not read"
    );
    assert_eq!(
        error("measure template=evm-sig"),
        "line 1: `template=evm-sig`: evm-sig records EVM data, which verilay does not keep"
    );
    let custom =
        "custom template formats are not supported; use ima-ng, ima-ngv2, ima-sig or ima-sigv2";
    assert_eq!(
        error("measure template=d-ngv2|n-ng|iuid"),
        format!("line 1: `template=d-ngv2|n-ng|iuid`: {custom}")
    );
    assert_eq!(
        error("measure template=d-ng"),
        format!("line 1: `template=d-ng`: {custom}")
    );
    assert_eq!(
        error("measure template=ima-ng template=ima-ng"),
        "line 1: `template=ima-ng`: template repeated: one template per rule"
    );
}

#[test]
fn digest_type_errors() {
    assert_eq!(
        error("measure digest_type=sha256"),
        "line 1: `digest_type=sha256`: the only digest_type is verity"
    );
    assert_eq!(
        error("dont_measure digest_type=verity"),
        "line 1: `digest_type=verity`: digest_type= is only for measure rules in verilay"
    );
    let needs = "digest_type=verity needs template=ima-ngv2 or ima-sigv2";
    assert_eq!(
        error("measure template=ima-ng digest_type=verity"),
        format!("line 1: `template=ima-ng`: {needs}")
    );
    assert_eq!(
        error("measure digest_type=verity template=ima-ng"),
        format!("line 1: `template=ima-ng`: {needs}")
    );
    assert_eq!(
        error("measure digest_type=verity template=ima-sig"),
        format!("line 1: `template=ima-sig`: {needs}")
    );
}

#[test]
fn refused_options() {
    for lsm in [
        "subj_user",
        "subj_role",
        "subj_type",
        "obj_user",
        "obj_role",
        "obj_type",
    ] {
        assert_eq!(
            error(&format!("measure {lsm}=system_u")),
            format!("line 1: `{lsm}=system_u`: no LSM labels in userspace")
        );
    }
    for opt in [
        "appraise_type=imasig",
        "appraise_flag=check_blacklist",
        "appraise_algos=sha256",
    ] {
        assert_eq!(
            error(&format!("measure {opt}")),
            format!("line 1: `{opt}`: only for appraise rules, which verilay does not do")
        );
    }
    assert_eq!(
        error("measure keyrings=.ima"),
        "line 1: `keyrings=.ima`: only for func=KEY_CHECK, which measures keys, not files"
    );
    assert_eq!(
        error("measure label=selinux"),
        "line 1: `label=selinux`: only for func=CRITICAL_DATA, which measures kernel data, not files"
    );
}

#[test]
fn first_error_refuses_the_whole_policy() {
    let e = Policy::parse("measure func=BPRM_CHECK\nmeasure func=MMAP_CHECK\nmeasure bogus\n")
        .unwrap_err();
    assert_eq!(e.line, 2);
    assert_eq!(
        e.message,
        "`func=MMAP_CHECK`: a FUSE filesystem does not see mmap"
    );
    assert_eq!(
        e.to_string(),
        "line 2: `func=MMAP_CHECK`: a FUSE filesystem does not see mmap"
    );
}

// ---- matching ------------------------------------------------------------------------

#[test]
fn first_match_wins() {
    let exempt_first = parse("dont_measure fsname=erofs\nmeasure\n");
    assert_eq!(
        decide(&exempt_first, Func::FileCheck, MAY_READ, user(0)),
        None
    );
    let exempt_last = parse("measure\ndont_measure fsname=erofs\n");
    assert_eq!(
        decide(&exempt_last, Func::FileCheck, MAY_READ, user(0)),
        Some(DEFAULT)
    );
    // A non-matching dont_measure does not exempt.
    let other_fs = parse("dont_measure fsname=tmpfs\nmeasure pcr=12\n");
    assert_eq!(
        decide(&other_fs, Func::FileCheck, MAY_READ, user(0)),
        Some(Measure { pcr: 12, ..DEFAULT })
    );
    // The first matching measure rule supplies pcr and template.
    let two = parse("measure func=BPRM_CHECK pcr=11\nmeasure pcr=12 template=ima-sig\n");
    assert_eq!(
        decide(&two, Func::BprmCheck, MAY_EXEC, user(0)),
        Some(Measure { pcr: 11, ..DEFAULT })
    );
    assert_eq!(
        decide(&two, Func::FileCheck, MAY_READ, user(0)),
        Some(Measure {
            pcr: 12,
            template: Template::ImaSig,
            verity: false
        })
    );
    // No rule matches: not measured.
    let none = parse("measure func=BPRM_CHECK\n");
    assert_eq!(decide(&none, Func::FileCheck, MAY_EXEC, user(0)), None);
}

#[test]
fn mask_exact_and_contains() {
    let rdonly = MAY_READ;
    let rdwr = MAY_READ | MAY_WRITE;
    let wronly = MAY_WRITE;
    let exact = parse("measure mask=MAY_READ");
    assert!(measured(&exact, Func::FileCheck, rdonly, user(0)));
    assert!(!measured(&exact, Func::FileCheck, rdwr, user(0)));
    assert!(!measured(&exact, Func::FileCheck, wronly, user(0)));
    let contains = parse("measure mask=^MAY_READ");
    assert!(measured(&contains, Func::FileCheck, rdonly, user(0)));
    assert!(measured(&contains, Func::FileCheck, rdwr, user(0)));
    assert!(!measured(&contains, Func::FileCheck, wronly, user(0)));
    // O_WRONLY|O_APPEND, O_RDWR|O_APPEND.
    let append = parse("measure mask=^MAY_APPEND");
    assert!(measured(
        &append,
        Func::FileCheck,
        MAY_WRITE | MAY_APPEND,
        user(0)
    ));
    assert!(measured(
        &append,
        Func::FileCheck,
        rdwr | MAY_APPEND,
        user(0)
    ));
    assert!(!measured(&append, Func::FileCheck, rdwr, user(0)));
    let append_exact = parse("measure mask=MAY_APPEND");
    assert!(!measured(
        &append_exact,
        Func::FileCheck,
        MAY_WRITE | MAY_APPEND,
        user(0)
    ));
    assert!(measured(
        &append_exact,
        Func::FileCheck,
        MAY_APPEND,
        user(0)
    ));
    let exec = parse("measure mask=MAY_EXEC");
    assert!(measured(&exec, Func::BprmCheck, MAY_EXEC, user(0)));
    assert!(!measured(
        &exec,
        Func::FileCheck,
        MAY_READ | MAY_EXEC,
        user(0)
    ));
    let write = parse("measure mask=^MAY_WRITE");
    assert!(measured(&write, Func::FileCheck, wronly, user(0)));
    assert!(measured(&write, Func::FileCheck, rdwr, user(0)));
    assert!(!measured(&write, Func::FileCheck, rdonly, user(0)));
}

#[test]
fn func_matching() {
    let open = parse("measure func=FILE_CHECK");
    assert!(measured(&open, Func::FileCheck, MAY_READ, user(0)));
    assert!(!measured(&open, Func::BprmCheck, MAY_EXEC, user(0)));
    let exec = parse("measure func=BPRM_CHECK");
    assert!(!measured(&exec, Func::FileCheck, MAY_READ, user(0)));
    assert!(measured(&exec, Func::BprmCheck, MAY_EXEC, user(0)));
    let path = parse("measure func=PATH_CHECK");
    assert!(measured(&path, Func::FileCheck, MAY_READ, user(0)));
    assert!(!measured(&path, Func::BprmCheck, MAY_EXEC, user(0)));
    let any = parse("measure");
    assert!(measured(&any, Func::FileCheck, MAY_WRITE, user(5)));
    assert!(measured(&any, Func::BprmCheck, MAY_EXEC, user(5)));
}

#[test]
fn uid_and_euid() {
    let real = parse("measure uid=0");
    let eff = parse("measure euid=0");
    // A setuid-root program run by user 1000: real 1000, effective 0.
    let setuid = ids(1000, 0, 0);
    assert!(!measured(&real, Func::FileCheck, MAY_READ, setuid));
    assert!(measured(&eff, Func::FileCheck, MAY_READ, setuid));
    // Root that dropped its euid to 1000: real 0, effective 1000, saved 0.
    let dropped = ids(0, 1000, 0);
    assert!(measured(&real, Func::FileCheck, MAY_READ, dropped));
    assert!(!measured(&eff, Func::FileCheck, MAY_READ, dropped));
    // With CAP_SETUID it could switch back: the saved or real uid also satisfies euid=.
    let dropped_cap = TaskIds {
        cap_setuid: true,
        ..dropped
    };
    assert!(measured(&eff, Func::FileCheck, MAY_READ, dropped_cap));
    let saved_only = TaskIds {
        cap_setuid: true,
        ..ids(1000, 1000, 0)
    };
    assert!(measured(&eff, Func::FileCheck, MAY_READ, saved_only));
    assert!(!measured(
        &eff,
        Func::FileCheck,
        MAY_READ,
        ids(1000, 1000, 0)
    ));
    assert!(!measured(&real, Func::FileCheck, MAY_READ, saved_only));
    let real_only = TaskIds {
        cap_setuid: true,
        ..ids(0, 1000, 1000)
    };
    assert!(measured(&eff, Func::FileCheck, MAY_READ, real_only));
    let nobody = TaskIds {
        cap_setuid: true,
        ..ids(1000, 1001, 1002)
    };
    assert!(!measured(&eff, Func::FileCheck, MAY_READ, nobody));
    // CAP_SETGID is not CAP_SETUID.
    let wrong_cap = TaskIds {
        cap_setgid: true,
        ..dropped
    };
    assert!(!measured(&eff, Func::FileCheck, MAY_READ, wrong_cap));
}

#[test]
fn gid_and_egid() {
    let t = |gid, egid, sgid, cap| TaskIds {
        uid: 7,
        euid: 7,
        suid: 7,
        gid,
        egid,
        sgid,
        cap_setuid: false,
        cap_setgid: cap,
    };
    let real = parse("measure gid=50");
    let eff = parse("measure egid=50");
    assert!(measured(
        &real,
        Func::FileCheck,
        MAY_READ,
        t(50, 1, 1, false)
    ));
    assert!(!measured(
        &real,
        Func::FileCheck,
        MAY_READ,
        t(1, 50, 50, true)
    ));
    assert!(measured(
        &eff,
        Func::FileCheck,
        MAY_READ,
        t(1, 50, 1, false)
    ));
    assert!(!measured(
        &eff,
        Func::FileCheck,
        MAY_READ,
        t(50, 1, 50, false)
    ));
    assert!(measured(&eff, Func::FileCheck, MAY_READ, t(1, 1, 50, true)));
    assert!(measured(&eff, Func::FileCheck, MAY_READ, t(50, 1, 1, true)));
    assert!(!measured(&eff, Func::FileCheck, MAY_READ, t(1, 2, 3, true)));
}

#[test]
fn comparison_operators() {
    let eq = parse("measure uid=1000");
    let lt = parse("measure uid<1000");
    let gt = parse("measure uid>1000");
    for (uid, e, l, g) in [
        (999, false, true, false),
        (1000, true, false, false),
        (1001, false, false, true),
    ] {
        assert_eq!(
            measured(&eq, Func::FileCheck, MAY_READ, user(uid)),
            e,
            "uid={uid}"
        );
        assert_eq!(
            measured(&lt, Func::FileCheck, MAY_READ, user(uid)),
            l,
            "uid<{uid}"
        );
        assert_eq!(
            measured(&gt, Func::FileCheck, MAY_READ, user(uid)),
            g,
            "uid>{uid}"
        );
    }
    let owner = parse("measure fowner>0");
    let group = parse("measure fgroup<100");
    let f = erofs();
    let d = |p: &Policy, o| {
        decide_full(p, Func::FileCheck, MAY_READ, &f, o, user(0))
            .0
            .is_some()
    };
    assert!(d(&owner, (1, 0)));
    assert!(!d(&owner, (0, 0)));
    assert!(d(&group, (0, 99)));
    assert!(!d(&group, (0, 100)));
    let both = parse("measure fowner=5 fgroup=6");
    assert!(d(&both, (5, 6)));
    assert!(!d(&both, (6, 5)));
    assert!(!d(&both, (5, 5)));
}

#[test]
fn fs_matching() {
    let other_uuid = [0u8; 16];
    let p = parse(&format!(
        "measure fsmagic=0xe0f5e1e2 pcr=1\nmeasure fsname=fuse pcr=2\nmeasure fsuuid={UUID_TEXT} pcr=3\n"
    ));
    let pcr = |f: &FsIdentity| {
        decide_full(&p, Func::FileCheck, MAY_READ, f, (0, 0), user(0))
            .0
            .map(|m| m.pcr)
    };
    assert_eq!(pcr(&fs(EROFS, "fuse", UUID)), Some(1));
    assert_eq!(pcr(&fs(0x6573_5546, "fuse", UUID)), Some(2));
    assert_eq!(pcr(&fs(0x6573_5546, "fuseblk", UUID)), Some(3));
    assert_eq!(pcr(&fs(0x6573_5546, "fuseblk", other_uuid)), None);
    // All three conditions together must all hold.
    let all = parse(&format!(
        "measure fsmagic=e0f5e1e2 fsname=erofs fsuuid={UUID_TEXT}"
    ));
    let m = |f: &FsIdentity| {
        decide_full(&all, Func::FileCheck, MAY_READ, f, (0, 0), user(0))
            .0
            .is_some()
    };
    assert!(m(&erofs()));
    assert!(!m(&fs(EROFS + 1, "erofs", UUID)));
    assert!(!m(&fs(EROFS, "Erofs", UUID)));
    assert!(!m(&fs(EROFS, "erofs", other_uuid)));
    // fsmagic=0 matches a filesystem whose magic is 0 (the CephFS bug, seen from the rule).
    let zero = parse("dont_measure fsmagic=0\nmeasure\n");
    let z = |f: &FsIdentity| decide_full(&zero, Func::FileCheck, MAY_READ, f, (0, 0), user(0)).0;
    assert_eq!(z(&fs(0, "ceph", UUID)), None);
    assert_eq!(z(&fs(CEPH, "ceph", UUID)), Some(DEFAULT));
}

#[test]
fn pcr_and_template_defaults() {
    let p = parse(
        "measure func=BPRM_CHECK\n\
         measure mask=MAY_WRITE pcr=11\n\
         measure mask=MAY_APPEND template=ima-sigv2\n\
         measure mask=MAY_READ digest_type=verity\n\
         measure mask=^MAY_READ digest_type=verity template=ima-sigv2 pcr=0\n",
    );
    let d = |func, mask| decide(&p, func, mask, user(0));
    assert_eq!(d(Func::BprmCheck, MAY_EXEC), Some(DEFAULT));
    assert_eq!(
        d(Func::FileCheck, MAY_WRITE),
        Some(Measure { pcr: 11, ..DEFAULT })
    );
    assert_eq!(
        d(Func::FileCheck, MAY_APPEND),
        Some(Measure {
            pcr: 10,
            template: Template::ImaSigV2,
            verity: false
        })
    );
    // digest_type=verity without template= takes ima-ngv2.
    assert_eq!(
        d(Func::FileCheck, MAY_READ),
        Some(Measure {
            pcr: 10,
            template: Template::ImaNgV2,
            verity: true
        })
    );
    assert_eq!(
        d(Func::FileCheck, MAY_READ | MAY_WRITE),
        Some(Measure {
            pcr: 0,
            template: Template::ImaSigV2,
            verity: true
        })
    );
    // The default template is not written back: the rule reads as it was written.
    assert_eq!(
        p.to_string().lines().nth(3),
        Some("measure mask=MAY_READ digest_type=verity")
    );
    let ngv2 = parse("measure digest_type=verity template=ima-ngv2");
    assert_eq!(
        decide(&ngv2, Func::FileCheck, MAY_READ, user(0)),
        Some(Measure {
            pcr: 10,
            template: Template::ImaNgV2,
            verity: true
        })
    );
    // permit_directio changes nothing.
    let directio = parse("measure permit_directio");
    assert_eq!(
        decide(&directio, Func::FileCheck, MAY_READ, user(0)),
        Some(DEFAULT)
    );
}

#[test]
fn task_fetched_only_when_needed() {
    let f = erofs();
    let calls = |p: &Policy, func, mask| decide_full(p, func, mask, &f, (0, 0), user(0)).1;
    // No id condition anywhere: never asked.
    let plain = parse(
        "dont_measure fsname=tmpfs\nmeasure func=FILE_CHECK fowner=0 fgroup=0 mask=^MAY_READ\n",
    );
    assert_eq!(calls(&plain, Func::FileCheck, MAY_READ), 0);
    // The id rule's cheap conditions fail first: never asked.
    let p = parse("measure func=BPRM_CHECK uid=0\nmeasure fsname=tmpfs euid=0\nmeasure mask=MAY_EXEC gid=0\nmeasure fowner=9 egid=0\ndont_measure\n");
    assert_eq!(calls(&p, Func::FileCheck, MAY_READ), 0);
    assert_eq!(decide(&p, Func::FileCheck, MAY_READ, user(0)), None);
    // Several id rules reached: asked once.
    let many =
        parse("measure func=FILE_CHECK uid=5\nmeasure euid=6\nmeasure gid=7\nmeasure egid>0\n");
    let (got, n) = decide_full(&many, Func::FileCheck, MAY_READ, &f, (0, 0), user(0));
    assert_eq!((got, n), (None, 1));
    let (got, n) = decide_full(&many, Func::FileCheck, MAY_READ, &f, (0, 0), user(7));
    assert_eq!((got, n), (Some(DEFAULT), 1));
    // An earlier rule without ids decides: never asked.
    let early = parse("dont_measure func=FILE_CHECK\nmeasure uid=0\n");
    assert_eq!(calls(&early, Func::FileCheck, MAY_READ), 0);
    assert_eq!(calls(&early, Func::BprmCheck, MAY_EXEC), 1);
}

#[test]
fn talos_like_policy() {
    let text = "\
# Talos-like: exempt pseudo and network filesystems, then measure root's reads.
dont_measure fsmagic=0x9fa0
dont_measure fsmagic=0x62656572
dont_measure fsmagic=0x64626720
dont_measure fsmagic=0x01021994
dont_measure fsmagic=0x1cd1
dont_measure fsmagic=0x42494e4d
dont_measure fsmagic=0x73636673
dont_measure fsmagic=0xf97cff8c
dont_measure fsmagic=0x43415d53
dont_measure fsmagic=0x27e0eb
dont_measure fsmagic=0x63677270
dont_measure fsmagic=0x6e736673
dont_measure fsmagic=0xde5e81e4
dont_measure fsmagic=0x00c36400
measure func=BPRM_CHECK mask=MAY_EXEC
measure func=FILE_CHECK mask=^MAY_READ euid=0
measure func=FILE_CHECK mask=^MAY_READ uid=0
";
    let p = parse(text);
    assert_eq!(p.len(), 17);
    let ceph_ok = fs(CEPH, "ceph", UUID);
    let ceph_bug = fs(0, "ceph", UUID);
    let d = |f: &FsIdentity, func, mask, t| decide_full(&p, func, mask, f, (0, 0), t);
    // A correct CephFS magic is exempt, and the task is never looked at.
    assert_eq!(d(&ceph_ok, Func::FileCheck, MAY_READ, user(0)), (None, 0));
    assert_eq!(
        d(&ceph_ok, Func::FileCheck, MAY_READ | MAY_WRITE, user(0)),
        (None, 0)
    );
    assert!(!p.may_measure(&ceph_ok));
    // With s_magic 0, root's reads and read-writes are measured; write-only opens are not.
    assert_eq!(
        d(&ceph_bug, Func::FileCheck, MAY_READ, user(0)),
        (Some(DEFAULT), 1)
    );
    assert_eq!(
        d(&ceph_bug, Func::FileCheck, MAY_READ | MAY_WRITE, user(0)),
        (Some(DEFAULT), 1)
    );
    assert_eq!(d(&ceph_bug, Func::FileCheck, MAY_WRITE, user(0)), (None, 0));
    assert!(p.may_measure(&ceph_bug));
    // Not root: asked once, not measured.
    assert_eq!(
        d(&ceph_bug, Func::FileCheck, MAY_READ, user(1000)),
        (None, 1)
    );
    // Real uid 0 with another euid: the uid=0 rule catches it.
    assert_eq!(
        d(&ceph_bug, Func::FileCheck, MAY_READ, ids(0, 1000, 1000)),
        (Some(DEFAULT), 1)
    );
    // Execs are measured for anyone.
    assert_eq!(
        d(&ceph_bug, Func::BprmCheck, MAY_EXEC, user(1000)),
        (Some(DEFAULT), 0)
    );
    // procfs, tmpfs: exempt.
    assert_eq!(
        d(
            &fs(0x9fa0, "proc", UUID),
            Func::BprmCheck,
            MAY_EXEC,
            user(0)
        ),
        (None, 0)
    );
    assert_eq!(
        d(
            &fs(0x0102_1994, "tmpfs", UUID),
            Func::FileCheck,
            MAY_READ,
            user(0)
        ),
        (None, 0)
    );
    // A FUSE mount is never exempt by magic.
    assert_eq!(
        d(
            &fs(0x6573_5546, "fuse", UUID),
            Func::FileCheck,
            MAY_READ,
            user(0)
        ),
        (Some(DEFAULT), 1)
    );
    // It reads back as written (canonical form), and again.
    let back = p.to_string();
    assert_eq!(back.lines().nth(3), Some("dont_measure fsmagic=0x1021994"));
    assert_eq!(back.lines().nth(13), Some("dont_measure fsmagic=0xc36400"));
    assert_eq!(
        back.lines().nth(15),
        Some("measure func=FILE_CHECK mask=^MAY_READ euid=0")
    );
    assert_eq!(parse(&back), p);
}

#[test]
fn may_measure() {
    let ext4 = fs(0xef53, "ext4", [7; 16]);
    let cases: [(&str, bool, bool); 10] = [
        // (policy, may_measure(erofs), may_measure(ext4))
        ("", false, false),
        ("dont_measure", false, false),
        ("measure", true, true),
        ("measure fsname=erofs", true, false),
        ("dont_measure fsname=erofs\nmeasure", false, true),
        ("measure\ndont_measure fsname=erofs", true, true),
        // A dont_measure rule with other conditions does not cover the filesystem.
        (
            "dont_measure fsname=erofs func=FILE_CHECK\nmeasure func=BPRM_CHECK",
            true,
            true,
        ),
        (
            "dont_measure fsmagic=0xe0f5e1e2 uid=0\nmeasure fsname=erofs",
            true,
            false,
        ),
        (
            "dont_measure fsuuid=12345678-9abc-def0-0123-456789abcdef fsname=erofs\nmeasure uid=0",
            false,
            true,
        ),
        // Only dont_measure rules: nothing is ever measured.
        (
            "dont_measure func=FILE_CHECK\ndont_measure uid=0",
            false,
            false,
        ),
    ];
    for (text, on_erofs, on_ext4) in cases {
        let p = parse(text);
        assert_eq!(p.may_measure(&erofs()), on_erofs, "{text:?} on erofs");
        assert_eq!(p.may_measure(&ext4), on_ext4, "{text:?} on ext4");
    }
}

#[test]
fn may_measure_any_of_passes_over_rules_for_other_functions() {
    let (file, exec) = (
        &[Func::FileCheck][..],
        &[Func::BprmCheck, Func::FileCheck][..],
    );
    let cases: [(&str, bool, bool); 5] = [
        // (policy, an open may be measured, an exec may be measured)
        ("measure func=BPRM_CHECK", false, true),
        ("measure func=FILE_CHECK mask=^MAY_READ", true, true),
        ("measure", true, true),
        // A dont_measure rule for one function does not end the search for others.
        (
            "dont_measure func=FILE_CHECK\nmeasure func=BPRM_CHECK",
            false,
            true,
        ),
        // One with filesystem conditions only ends it for every function.
        (
            "dont_measure fsname=erofs\nmeasure func=BPRM_CHECK",
            false,
            false,
        ),
    ];
    for (text, on_open, on_exec) in cases {
        let p = parse(text);
        assert_eq!(
            p.may_measure_any_of(&erofs(), file),
            on_open,
            "{text:?} open"
        );
        assert_eq!(
            p.may_measure_any_of(&erofs(), exec),
            on_exec,
            "{text:?} exec"
        );
    }
}

// ---- round trip and robustness -------------------------------------------------------

#[test]
fn display_round_trips() {
    let text = format!(
        "dont_measure fsmagic=0x9fa0 permit_directio\n\
         measure func=BPRM_CHECK mask=MAY_EXEC pcr=11 template=ima-sig\n\
         measure func=FILE_CHECK mask=^MAY_READ fsname=erofs fsuuid={UUID_TEXT} euid>0 egid<5 fowner=3 fgroup>4 digest_type=verity\n\
         measure uid<1000 gid=2 template=ima-ngv2 digest_type=verity\n"
    );
    let p = parse(&text);
    assert_eq!(p.to_string(), text);
    assert_eq!(parse(&p.to_string()), p);
}

#[path = "../../erofs/tests/common/xorshift.rs"]
mod xorshift;
// xorshift64*: enough randomness for a fuzz test without a dependency.
use xorshift::XorShiftStar as Rng;

#[test]
fn fuzz_random_bytes_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let f = erofs();
    for _ in 0..20_000 {
        let len = rng.below(64);
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                // Bias towards the characters the grammar cares about.
                const HOT: &[u8] = b" \t\n#=<>^|-0x9fFmeasur_";
                if rng.below(2) == 0 {
                    HOT[rng.below(HOT.len())]
                } else {
                    rng.next_u64() as u8
                }
            })
            .collect();
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(p) = Policy::parse(&text) {
            let again = parse(&p.to_string());
            assert_eq!(again, p, "{text:?}");
            let _ = decide_full(&p, Func::FileCheck, MAY_READ, &f, (0, 0), user(0));
            let _ = p.may_measure(&f);
        }
    }
}

#[test]
fn fuzz_random_rules_round_trip() {
    const VOCAB: &[&str] = &[
        "measure",
        "dont_measure",
        "appraise",
        "func=FILE_CHECK",
        "func=PATH_CHECK",
        "func=BPRM_CHECK",
        "func=MMAP_CHECK",
        "func=NOPE",
        "mask=MAY_READ",
        "mask=^MAY_READ",
        "mask=^MAY_WRITE",
        "mask=MAY_EXEC",
        "mask=^MAY_APPEND",
        "mask=^",
        "uid=0",
        "uid<1000",
        "euid=0",
        "euid>5",
        "gid=0",
        "egid<9",
        "fowner=0",
        "fowner>1",
        "fgroup=0",
        "fgroup<3",
        "uid=4294967295",
        "fsmagic=0x9fa0",
        "fsmagic=EF53",
        "fsmagic=zz",
        "fsname=erofs",
        "fsname=fuse",
        "fsuuid=12345678-9abc-def0-0123-456789abcdef",
        "fsuuid=nope",
        "pcr=0",
        "pcr=11",
        "pcr=23",
        "pcr=24",
        "template=ima-ng",
        "template=ima-ngv2",
        "template=ima-sig",
        "template=ima-sigv2",
        "template=ima",
        "digest_type=verity",
        "digest_type=x",
        "permit_directio",
        "#",
        "# c",
        "subj_type=x",
        "bogus",
        "",
    ];
    let mut rng = Rng(42);
    let mut parsed = 0;
    let f = erofs();
    for _ in 0..20_000 {
        let lines = 1 + rng.below(4);
        let mut text = String::new();
        for _ in 0..lines {
            let n = rng.below(6);
            let words: Vec<&str> = (0..n).map(|_| VOCAB[rng.below(VOCAB.len())]).collect();
            let sep = if rng.below(4) == 0 { "\t" } else { " " };
            text.push_str(&words.join(sep));
            text.push('\n');
        }
        match Policy::parse(&text) {
            Ok(p) => {
                parsed += 1;
                let back = p.to_string();
                let again = parse(&back);
                assert_eq!(again, p, "{text:?} -> {back:?}");
                assert_eq!(again.to_string(), back);
                for (func, mask) in [(Func::FileCheck, MAY_READ), (Func::BprmCheck, MAY_EXEC)] {
                    let (got, calls) = decide_full(&p, func, mask, &f, (0, 0), user(0));
                    assert!(calls <= 1, "{text:?}");
                    if got.is_some() {
                        assert!(
                            p.may_measure(&f),
                            "{text:?}: measured but may_measure says no"
                        );
                    }
                }
            }
            Err(e) => {
                assert!(e.line >= 1 && e.line <= lines, "{text:?}: {e}");
                assert!(
                    e.message.contains('`') || e.message.starts_with("no action"),
                    "{e}"
                );
            }
        }
    }
    // The vocabulary produces valid policies often enough for the round trip to mean something.
    assert!(parsed > 1000, "only {parsed} policies parsed");
}
