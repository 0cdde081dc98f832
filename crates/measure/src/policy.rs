//! IMA measurement policies in the kernel's syntax, matched in userspace as IMA would
//! ([`Policy::parse`] lists what is supported).
//!
//! - Parsing follows `ima_parse_rule`, `ima_validate_rule`: a bad rule refuses the whole
//!   policy.
//! - Matching follows `ima_match_policy`: the first matching `measure` or `dont_measure` rule
//!   decides.

use std::fmt;

/// The kernel's access-mask bit for an exec (`include/linux/fs.h`).
pub const MAY_EXEC: u32 = 0x1;
/// The kernel's access-mask bit for writing.
pub const MAY_WRITE: u32 = 0x2;
/// The kernel's access-mask bit for reading.
pub const MAY_READ: u32 = 0x4;
/// The kernel's access-mask bit for appending.
pub const MAY_APPEND: u32 = 0x8;

/// The PCR IMA extends unless a rule says otherwise (CONFIG_IMA_MEASURE_PCR_IDX).
const DEFAULT_PCR: u32 = 10;

/// Largest policy accepted, in bytes: real policies are a few KiB; the cap keeps a
/// hostile or mistaken one (a device, a huge file) from growing the daemon.
pub const MAX_POLICY_BYTES: u64 = 1 << 20;
/// Longest line: the kernel parses a policy written in writes of at most PAGE_SIZE - 1
/// bytes (`ima_write_policy`), so no rule it accepts is longer.
pub const MAX_LINE: usize = 4095;
/// Most rules: every open walks the rules in order, so their number is the cost of an
/// open; a few dozen is a large real policy.
pub const MAX_RULES: usize = 4096;
/// A TPM 2.0 PC client has 24 PCRs.
const PCR_COUNT: u32 = 24;

/// The hook a measurement is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    /// An open (`FILE_CHECK`).
    FileCheck,
    /// An exec (`BPRM_CHECK`).
    BprmCheck,
}

impl Func {
    fn name(self) -> &'static str {
        match self {
            Func::FileCheck => "FILE_CHECK",
            Func::BprmCheck => "BPRM_CHECK",
        }
    }
}

/// The measurement-list templates verilay writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Template {
    /// `d-ng|n-ng`
    ImaNg,
    /// `d-ngv2|n-ng`
    ImaNgV2,
    /// `d-ng|n-ng|sig`
    ImaSig,
    /// `d-ngv2|n-ng|sig`
    ImaSigV2,
}

impl Template {
    const ALL: [Template; 4] = [
        Template::ImaNg,
        Template::ImaNgV2,
        Template::ImaSig,
        Template::ImaSigV2,
    ];

    /// The template's name, as in `template=` and in the measurement list.
    pub fn name(self) -> &'static str {
        match self {
            Template::ImaNg => "ima-ng",
            Template::ImaNgV2 => "ima-ngv2",
            Template::ImaSig => "ima-sig",
            Template::ImaSigV2 => "ima-sigv2",
        }
    }

    /// Whether the template carries the file's signature (`sig` field).
    pub fn has_sig(self) -> bool {
        matches!(self, Template::ImaSig | Template::ImaSigV2)
    }

    /// Whether the digest field is `d-ngv2` (which names the digest's kind, so it can
    /// hold an fs-verity digest).
    pub fn is_v2(self) -> bool {
        matches!(self, Template::ImaNgV2 | Template::ImaSigV2)
    }

    /// The kernel's format string for the template (`ima_template.c`).
    fn format(self) -> &'static str {
        match self {
            Template::ImaNg => "d-ng|n-ng",
            Template::ImaNgV2 => "d-ngv2|n-ng",
            Template::ImaSig => "d-ng|n-ng|sig",
            Template::ImaSigV2 => "d-ngv2|n-ng|sig",
        }
    }
}

/// What the task doing the access is; fetched only if a rule's earlier conditions matched
/// and it has a uid/euid/gid/egid condition.
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskIds {
    /// The real user ID.
    pub uid: u32,
    /// The effective user ID.
    pub euid: u32,
    /// The saved user ID.
    pub suid: u32,
    /// The real group ID.
    pub gid: u32,
    /// The effective group ID.
    pub egid: u32,
    /// The saved group ID.
    pub sgid: u32,
    /// Whether CAP_SETUID is in its effective set.
    pub cap_setuid: bool,
    /// Whether CAP_SETGID is in its effective set.
    pub cap_setgid: bool,
}

/// The filesystem identity of the layer serving the file.
#[derive(Clone, Debug)]
pub struct FsIdentity {
    /// The filesystem's magic number (`fsmagic=`).
    pub magic: u64,
    /// The filesystem's name (`fsname=`).
    pub name: String,
    /// The filesystem's UUID (`fsuuid=`).
    pub uuid: [u8; 16],
}

/// One access the policy is asked about.
#[derive(Clone, Copy, Debug)]
pub struct Access<'a> {
    /// The hook: an open or an exec.
    pub func: Func,
    /// MAY_* bits: an open's access mode (O_RDONLY: MAY_READ, O_WRONLY: MAY_WRITE,
    /// O_RDWR: both, plus MAY_APPEND for O_APPEND); MAY_EXEC for an exec.
    pub mask: u32,
    /// The file's owner (a uid).
    pub fowner: u32,
    /// The file's group (a gid).
    pub fgroup: u32,
    /// The filesystem of the layer serving the file.
    pub fs: &'a FsIdentity,
}

/// What a matching measure rule asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measure {
    /// The PCR to extend: the rule's `pcr=`, else 10.
    pub pcr: u32,
    /// The rule's `template=`, else ima-ng (ima-ngv2 for `digest_type=verity`).
    pub template: Template,
    /// `digest_type=verity`: measure the file's fs-verity digest, not a hash of its data.
    pub verity: bool,
}

/// A policy that refused to parse: the first bad rule, as the kernel refuses the whole
/// write at the first one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct PolicyError {
    /// The bad rule's line, 1-based.
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Measure,
    DontMeasure,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MaskCond {
    /// `mask=X`: the access mask is exactly X.
    Exact(u32),
    /// `mask=^X`: the access mask contains X.
    Contains(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Eq,
    Lt,
    Gt,
}

impl Op {
    fn symbol(self) -> char {
        match self {
            Op::Eq => '=',
            Op::Lt => '<',
            Op::Gt => '>',
        }
    }
}

/// `value OP id`, e.g. `uid<1000` holds for ids below 1000.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IdCond {
    op: Op,
    id: u32,
}

impl IdCond {
    fn holds(self, value: u32) -> bool {
        match self.op {
            Op::Eq => value == self.id,
            Op::Lt => value < self.id,
            Op::Gt => value > self.id,
        }
    }
}

/// The uid (or gid) slot of a rule: real or effective id, as the kernel keeps one
/// id and one operator for both (`entry->uid`, `entry->uid_op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TaskCond {
    effective: bool,
    cond: IdCond,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    action: Action,
    func: Option<Func>,
    mask: Option<MaskCond>,
    fsmagic: Option<u64>,
    fsname: Option<String>,
    fsuuid: Option<[u8; 16]>,
    uid: Option<TaskCond>,
    gid: Option<TaskCond>,
    fowner: Option<IdCond>,
    fgroup: Option<IdCond>,
    pcr: Option<u32>,
    template: Option<Template>,
    verity: bool,
    permit_directio: bool,
}

impl Rule {
    fn matches_fs(&self, fs: &FsIdentity) -> bool {
        self.fsmagic.is_none_or(|m| m == fs.magic)
            && self.fsname.as_deref().is_none_or(|n| n == fs.name)
            && self.fsuuid.is_none_or(|u| u == fs.uuid)
    }

    /// Everything but the task's ids, which may cost a lookup.
    fn matches_cheap(&self, a: &Access<'_>) -> bool {
        self.func.is_none_or(|f| f == a.func)
            && self.mask.is_none_or(|m| match m {
                MaskCond::Exact(bits) => a.mask == bits,
                MaskCond::Contains(bits) => a.mask & bits != 0,
            })
            && self.matches_fs(a.fs)
            && self.fowner.is_none_or(|c| c.holds(a.fowner))
            && self.fgroup.is_none_or(|c| c.holds(a.fgroup))
    }

    fn needs_task(&self) -> bool {
        self.uid.is_some() || self.gid.is_some()
    }

    /// `ima_match_rules`: with CAP_SETUID an euid condition also holds if the saved or
    /// real uid satisfies it (the task could switch to either); egid likewise.
    fn matches_task(&self, t: &TaskIds) -> bool {
        let id_ok = |slot: Option<TaskCond>, real: u32, eff: u32, saved: u32, cap: bool| {
            slot.is_none_or(|s| {
                if !s.effective {
                    s.cond.holds(real)
                } else if cap {
                    s.cond.holds(eff) || s.cond.holds(saved) || s.cond.holds(real)
                } else {
                    s.cond.holds(eff)
                }
            })
        };
        id_ok(self.uid, t.uid, t.euid, t.suid, t.cap_setuid)
            && id_ok(self.gid, t.gid, t.egid, t.sgid, t.cap_setgid)
    }

    /// The rule constrains nothing but the filesystem.
    fn only_fs_conditions(&self) -> bool {
        self.func.is_none()
            && self.mask.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.fowner.is_none()
            && self.fgroup.is_none()
    }

    fn measure(&self) -> Measure {
        let fallback = if self.verity {
            Template::ImaNgV2
        } else {
            Template::ImaNg
        };
        Measure {
            pcr: self.pcr.unwrap_or(DEFAULT_PCR),
            template: self.template.unwrap_or(fallback),
            verity: self.verity,
        }
    }
}

/// Reads back like `/sys/kernel/security/ima/policy` (`ima_policy_show`), in its token
/// order, without its trailing space.
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.action {
            Action::Measure => "measure",
            Action::DontMeasure => "dont_measure",
        })?;
        if let Some(func) = self.func {
            write!(f, " func={}", func.name())?;
        }
        if let Some(mask) = self.mask {
            let (caret, bits) = match mask {
                MaskCond::Exact(b) => ("", b),
                MaskCond::Contains(b) => ("^", b),
            };
            write!(f, " mask={caret}{}", mask_name(bits))?;
        }
        if let Some(magic) = self.fsmagic {
            write!(f, " fsmagic={magic:#x}")?;
        }
        if let Some(name) = &self.fsname {
            write!(f, " fsname={name}")?;
        }
        if let Some(pcr) = self.pcr {
            write!(f, " pcr={pcr}")?;
        }
        if let Some(uuid) = &self.fsuuid {
            write!(f, " fsuuid={}", uuid_text(uuid))?;
        }
        let task = |f: &mut fmt::Formatter<'_>, s: TaskCond, real: &str, eff: &str| {
            let key = if s.effective { eff } else { real };
            write!(f, " {key}{}{}", s.cond.op.symbol(), s.cond.id)
        };
        if let Some(s) = self.uid {
            task(f, s, "uid", "euid")?;
        }
        if let Some(s) = self.gid {
            task(f, s, "gid", "egid")?;
        }
        if let Some(c) = self.fowner {
            write!(f, " fowner{}{}", c.op.symbol(), c.id)?;
        }
        if let Some(c) = self.fgroup {
            write!(f, " fgroup{}{}", c.op.symbol(), c.id)?;
        }
        if let Some(t) = self.template {
            write!(f, " template={}", t.name())?;
        }
        if self.verity {
            f.write_str(" digest_type=verity")?;
        }
        if self.permit_directio {
            f.write_str(" permit_directio")?;
        }
        Ok(())
    }
}

fn mask_name(bits: u32) -> &'static str {
    match bits {
        MAY_EXEC => "MAY_EXEC",
        MAY_WRITE => "MAY_WRITE",
        MAY_READ => "MAY_READ",
        _ => "MAY_APPEND",
    }
}

/// A parsed policy: its rules in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    rules: Vec<Rule>,
}

impl Policy {
    /// Parses a policy in IMA's syntax; the first bad rule refuses the whole policy. An
    /// empty policy (only blank lines and comments) parses and measures nothing. Lines
    /// longer than [`MAX_LINE`] bytes and policies of more than [`MAX_RULES`] rules are
    /// refused.
    ///
    /// Supported: `measure`, `dont_measure`; `func=FILE_CHECK` (`PATH_CHECK`, an open),
    /// `BPRM_CHECK` (an exec); `mask=MAY_EXEC|MAY_WRITE|MAY_READ|MAY_APPEND` (exact, or
    /// with `^` "contains"); `uid`, `euid`, `gid`, `egid`, `fowner`, `fgroup` with `=`, `<`
    /// or `>`; `fsmagic=`, `fsname=`, `fsuuid=`; on measure rules `pcr=` (0-23),
    /// `template=` (the four [`Template`]s) and `digest_type=verity`; `permit_directio`,
    /// accepted and ignored (verilay always hashes through its own reads).
    ///
    /// Refused, each with its reason: other actions (verilay only measures), other funcs
    /// (mmap is invisible to a FUSE filesystem; the rest are not file opens), LSM labels
    /// (no LSM in userspace), `appraise_*`, `keyrings=`, `label=`, and any unknown token.
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        let mut rules = Vec::new();
        // The kernel splits on '\n' only ("\r" would be part of a token there too).
        for (i, line) in text.split('\n').enumerate() {
            let line_no = i + 1;
            let error = |message| PolicyError {
                line: line_no,
                message,
            };
            if line.len() > MAX_LINE {
                return Err(error(format!(
                    "{} bytes long; a rule has at most {MAX_LINE}",
                    line.len()
                )));
            }
            if let Some(rule) = parse_rule(line).map_err(error)? {
                if rules.len() == MAX_RULES {
                    return Err(error(format!("more than {MAX_RULES} rules")));
                }
                rules.push(rule);
            }
        }
        Ok(Policy { rules })
    }

    /// [`Policy::parse`] of a policy file's bytes, which must be UTF-8 text of at most
    /// [`MAX_POLICY_BYTES`].
    pub fn parse_bytes(bytes: &[u8]) -> Result<Policy, PolicyError> {
        if bytes.len() as u64 > MAX_POLICY_BYTES {
            return Err(PolicyError {
                line: 1 + bytes[..MAX_POLICY_BYTES as usize]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count(),
                message: format!(
                    "the policy is {} bytes, more than the {MAX_POLICY_BYTES} it may have",
                    bytes.len()
                ),
            });
        }
        let text = std::str::from_utf8(bytes).map_err(|e| {
            let at = e.valid_up_to();
            PolicyError {
                line: 1 + bytes[..at].iter().filter(|&&b| b == b'\n').count(),
                message: format!("not UTF-8 text (byte {at} of the file)"),
            }
        })?;
        Policy::parse(text)
    }

    /// The PCRs its measure rules may extend, ascending (10 unless a rule says `pcr=`).
    pub fn pcrs(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .rules
            .iter()
            .filter(|r| r.action == Action::Measure)
            .map(|r| r.measure().pcr)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Whether it has no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// First matching rule wins (IMA's "measure" family): Some(measure) for a measure
    /// rule, None for dont_measure or no match. `task` is called at most once, and only
    /// when a rule needs task ids after its other conditions matched.
    pub fn decide(
        &self,
        access: &Access<'_>,
        task: &mut dyn FnMut() -> TaskIds,
    ) -> Option<Measure> {
        let mut ids: Option<TaskIds> = None;
        for rule in &self.rules {
            if !rule.matches_cheap(access) {
                continue;
            }
            if rule.needs_task() {
                let t = *ids.get_or_insert_with(&mut *task);
                if !rule.matches_task(&t) {
                    continue;
                }
            }
            return match rule.action {
                Action::Measure => Some(rule.measure()),
                Action::DontMeasure => None,
            };
        }
        None
    }

    /// Whether some rule has a uid, euid, gid or egid condition: then the decision for
    /// one file can differ from one opener to the next.
    pub fn depends_on_task(&self) -> bool {
        self.rules.iter().any(Rule::needs_task)
    }

    /// Whether any access to a file on `fs` can be measured. False only when provably
    /// not: no measure rule accepts `fs`, or a `dont_measure` rule with nothing but
    /// filesystem conditions (or none) accepts `fs` before any measure rule that does.
    /// Conditions on func, mask and ids are not reasoned about: such rules may match.
    pub fn may_measure(&self, fs: &FsIdentity) -> bool {
        self.may_measure_funcs(fs, None)
    }

    /// [`Policy::may_measure`] for accesses by one of `funcs` only: rules for other
    /// functions are passed over.
    pub fn may_measure_any_of(&self, fs: &FsIdentity, funcs: &[Func]) -> bool {
        self.may_measure_funcs(fs, Some(funcs))
    }

    fn may_measure_funcs(&self, fs: &FsIdentity, funcs: Option<&[Func]>) -> bool {
        let applies = |r: &&Rule| {
            r.matches_fs(fs) && funcs.is_none_or(|funcs| r.func.is_none_or(|f| funcs.contains(&f)))
        };
        for rule in self.rules.iter().filter(applies) {
            match rule.action {
                Action::Measure => return true,
                // Every access on `fs` reaching this rule stops here.
                Action::DontMeasure if rule.only_fs_conditions() => return false,
                Action::DontMeasure => {}
            }
        }
        false
    }
}

/// One rule per line, in canonical IMA syntax; parses back to the same policy.
impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for rule in &self.rules {
            writeln!(f, "{rule}")?;
        }
        Ok(())
    }
}

/// A token for a message: control characters escaped, so a stray `\r` or NUL shows.
fn quote(token: &str) -> String {
    let mut s = String::with_capacity(token.len() + 2);
    s.push('`');
    for c in token.chars() {
        if c.is_control() {
            s.extend(c.escape_debug());
        } else {
            s.push(c);
        }
    }
    s.push('`');
    s
}

fn err(token: &str, why: &str) -> String {
    format!("{}: {why}", quote(token))
}

/// A rule under construction: the action may come anywhere in the line, as in the kernel.
#[derive(Default)]
struct Draft<'a> {
    action: Option<Action>,
    func: Option<Func>,
    mask: Option<MaskCond>,
    fsmagic: Option<u64>,
    fsname: Option<&'a str>,
    fsuuid: Option<[u8; 16]>,
    uid: Option<TaskCond>,
    gid: Option<TaskCond>,
    fowner: Option<IdCond>,
    fgroup: Option<IdCond>,
    pcr: Option<(u32, &'a str)>,
    template: Option<(Template, &'a str)>,
    verity: Option<&'a str>,
    permit_directio: bool,
}

/// `ima_parse_add_rule` + `ima_parse_rule` + `ima_validate_rule` for one line: Ok(None)
/// for a blank or comment line.
fn parse_rule(line: &str) -> Result<Option<Rule>, String> {
    // Tokens are separated by spaces and tabs only; a token starting with '#' ends the
    // rule ("ignore suffixed comment"), a '#' inside a token is part of it.
    let tokens = line
        .split([' ', '\t'])
        .filter(|t| !t.is_empty())
        .take_while(|t| !t.starts_with('#'));
    let mut d = Draft::default();
    let mut any = false;
    for token in tokens {
        any = true;
        parse_token(&mut d, token)?;
    }
    if !any {
        return Ok(None);
    }
    let Some(action) = d.action else {
        return Err("no action: a rule needs `measure` or `dont_measure`".into());
    };
    // Checked once the whole rule is read, like `ima_validate_rule`.
    if action == Action::DontMeasure {
        if let Some((_, tok)) = d.pcr {
            return Err(err(tok, "pcr= is only for measure rules"));
        }
        if let Some(tok) = d.verity {
            return Err(err(
                tok,
                "digest_type= is only for measure rules in verilay",
            ));
        }
    }
    if d.verity.is_some() {
        if let Some((t, tok)) = d.template {
            if !t.is_v2() {
                return Err(err(
                    tok,
                    "digest_type=verity needs template=ima-ngv2 or ima-sigv2",
                ));
            }
        }
    }
    Ok(Some(Rule {
        action,
        func: d.func,
        mask: d.mask,
        fsmagic: d.fsmagic,
        fsname: d.fsname.map(str::to_owned),
        fsuuid: d.fsuuid,
        uid: d.uid,
        gid: d.gid,
        fowner: d.fowner,
        fgroup: d.fgroup,
        pcr: d.pcr.map(|(p, _)| p),
        template: d.template.map(|(t, _)| t),
        verity: d.verity.is_some(),
        permit_directio: d.permit_directio,
    }))
}

/// Which slot of a rule an id condition fills. As in the kernel, uid and euid share one
/// (`entry->uid`), gid and egid another.
#[derive(Clone, Copy)]
enum IdSlot {
    Uid,
    Gid,
    Fowner,
    Fgroup,
}

/// `key` followed by `=`, `<` or `>`: the slot, and whether the key is an effective id.
const ID_KEYS: [(&str, IdSlot, bool); 6] = [
    ("uid", IdSlot::Uid, false),
    ("euid", IdSlot::Uid, true),
    ("gid", IdSlot::Gid, false),
    ("egid", IdSlot::Gid, true),
    ("fowner", IdSlot::Fowner, false),
    ("fgroup", IdSlot::Fgroup, false),
];

/// Keys written `key=value` (the kernel's `key=%s` patterns), supported or not.
const VALUE_KEYS: [&str; 19] = [
    "func",
    "mask",
    "fsmagic",
    "fsname",
    "fsuuid",
    "pcr",
    "template",
    "digest_type",
    "subj_user",
    "subj_role",
    "subj_type",
    "obj_user",
    "obj_role",
    "obj_type",
    "appraise_type",
    "appraise_flag",
    "appraise_algos",
    "keyrings",
    "label",
];

fn parse_token<'a>(d: &mut Draft<'a>, token: &'a str) -> Result<(), String> {
    let e = |why: &str| err(token, why);
    // Bare words.
    let action = match token {
        "measure" => Action::Measure,
        "dont_measure" => Action::DontMeasure,
        "appraise" | "dont_appraise" => return Err(e("verilay measures; it does not appraise")),
        "audit" => return Err(e("verilay measures; it does not audit")),
        "hash" | "dont_hash" => return Err(e("verilay measures; it does not hash")),
        "permit_directio" => {
            // Lets the kernel hash O_DIRECT opens; verilay hashes through its own reads.
            d.permit_directio = true;
            return Ok(());
        }
        _ => return parse_condition(d, token),
    };
    if d.action.is_some() {
        return Err(e("a rule has exactly one action"));
    }
    d.action = Some(action);
    Ok(())
}

fn parse_condition<'a>(d: &mut Draft<'a>, token: &'a str) -> Result<(), String> {
    let e = |why: &str| err(token, why);
    // Id conditions: key, operator, decimal id.
    for (name, slot, effective) in ID_KEYS {
        let Some(rest) = token.strip_prefix(name) else {
            continue;
        };
        let op = match rest.as_bytes().first() {
            Some(b'=') => Op::Eq,
            Some(b'<') => Op::Lt,
            Some(b'>') => Op::Gt,
            _ => continue,
        };
        let cond = IdCond {
            op,
            id: parse_id(&rest[1..]).map_err(&e)?,
        };
        // A repeat refuses the whole policy, so overwriting before saying so is harmless.
        let taken = match slot {
            IdSlot::Uid => d.uid.replace(TaskCond { effective, cond }).is_some(),
            IdSlot::Gid => d.gid.replace(TaskCond { effective, cond }).is_some(),
            IdSlot::Fowner => d.fowner.replace(cond).is_some(),
            IdSlot::Fgroup => d.fgroup.replace(cond).is_some(),
        };
        if taken {
            return Err(e(match slot {
                IdSlot::Uid => "uid and euid share one condition per rule",
                IdSlot::Gid => "gid and egid share one condition per rule",
                IdSlot::Fowner => "fowner repeated: one fowner condition per rule",
                IdSlot::Fgroup => "fgroup repeated: one fgroup condition per rule",
            }));
        }
        return Ok(());
    }

    let Some((key, value)) = token.split_once('=') else {
        return Err(e("unknown token"));
    };
    if !VALUE_KEYS.contains(&key) {
        return Err(e("unknown token"));
    }
    // The kernel's `%s` needs at least one character: `func=` matches no pattern there.
    if value.is_empty() {
        return Err(e("empty value"));
    }
    match key {
        "func" => {
            let func = parse_func(value).map_err(&e)?;
            if d.func.is_some() {
                return Err(e("func repeated: one func per rule"));
            }
            d.func = Some(func);
        }
        "mask" => {
            let (contains, name) = match value.strip_prefix('^') {
                Some(name) => (true, name),
                None => (false, value),
            };
            let bits = match name {
                "MAY_EXEC" => MAY_EXEC,
                "MAY_WRITE" => MAY_WRITE,
                "MAY_READ" => MAY_READ,
                "MAY_APPEND" => MAY_APPEND,
                _ => {
                    return Err(e(
                        "unknown mask (MAY_EXEC, MAY_WRITE, MAY_READ or MAY_APPEND, optionally prefixed ^)",
                    ))
                }
            };
            if d.mask.is_some() {
                return Err(e("mask repeated: one mask per rule"));
            }
            d.mask = Some(if contains {
                MaskCond::Contains(bits)
            } else {
                MaskCond::Exact(bits)
            });
        }
        "fsmagic" => {
            let magic = parse_hex(value).map_err(&e)?;
            if d.fsmagic.is_some() {
                return Err(e("fsmagic repeated: one fsmagic per rule"));
            }
            d.fsmagic = Some(magic);
        }
        // The kernel keeps the last fsname= of a rule.
        "fsname" => d.fsname = Some(value),
        "fsuuid" => {
            let uuid = parse_uuid(value).ok_or_else(|| e("not a UUID (8-4-4-4-12 hex digits)"))?;
            if d.fsuuid.is_some() {
                return Err(e("fsuuid repeated: one fsuuid per rule"));
            }
            d.fsuuid = Some(uuid);
        }
        "pcr" => {
            // Last wins, as in the kernel; only the range is checked here, the action
            // once the rule is complete.
            let pcr = match value.parse::<i64>() {
                Ok(n) => u32::try_from(n).ok().filter(|&n| n < PCR_COUNT),
                Err(er) if is_overflow(&er) => None,
                Err(_) => return Err(e("not a decimal number")),
            };
            let pcr = pcr.ok_or_else(|| e("a TPM has 24 PCRs (0-23)"))?;
            d.pcr = Some((pcr, token));
        }
        "template" => {
            // The kernel checks the action when it reads template=, so the action
            // must come before it (`ima_parse_rule`, Opt_template).
            match d.action {
                Some(Action::Measure) => {}
                Some(Action::DontMeasure) => {
                    return Err(e("template= is only for measure rules"));
                }
                None => return Err(e("template= must follow the measure action")),
            }
            let t = parse_template(value).map_err(&e)?;
            if d.template.is_some() {
                return Err(e("template repeated: one template per rule"));
            }
            d.template = Some((t, token));
        }
        "digest_type" => {
            if value != "verity" {
                return Err(e("the only digest_type is verity"));
            }
            d.verity = Some(token);
        }
        "subj_user" | "subj_role" | "subj_type" | "obj_user" | "obj_role" | "obj_type" => {
            return Err(e("no LSM labels in userspace"));
        }
        "appraise_type" | "appraise_flag" | "appraise_algos" => {
            return Err(e("only for appraise rules, which verilay does not do"));
        }
        "keyrings" => return Err(e("only for func=KEY_CHECK, which measures keys, not files")),
        "label" => {
            return Err(e(
                "only for func=CRITICAL_DATA, which measures kernel data, not files",
            ))
        }
        _ => return Err(e("unknown token")),
    }
    Ok(())
}

fn parse_func(name: &str) -> Result<Func, &'static str> {
    match name {
        "FILE_CHECK" | "PATH_CHECK" => Ok(Func::FileCheck),
        "BPRM_CHECK" => Ok(Func::BprmCheck),
        "MMAP_CHECK" | "FILE_MMAP" | "MMAP_CHECK_REQPROT" => {
            Err("a FUSE filesystem does not see mmap")
        }
        "CREDS_CHECK"
        | "MODULE_CHECK"
        | "FIRMWARE_CHECK"
        | "KEXEC_KERNEL_CHECK"
        | "KEXEC_INITRAMFS_CHECK"
        | "POLICY_CHECK"
        | "KEXEC_CMDLINE"
        | "KEY_CHECK"
        | "CRITICAL_DATA"
        | "SETXATTR_CHECK" => Err("not a file open or exec"),
        _ => Err("unknown func"),
    }
}

fn parse_template(value: &str) -> Result<Template, &'static str> {
    // The kernel's lookup_template_desc() finds a template by name or by format.
    if let Some(t) = Template::ALL
        .into_iter()
        .find(|t| value == t.name() || value == t.format())
    {
        return Ok(t);
    }
    match value {
        "ima" | "d|n" => Err("the original ima template (SHA-1 without an algorithm name) is not supported; use ima-ng"),
        "ima-buf" | "d-ng|n-ng|buf" => Err("ima-buf records buffers, not files"),
        "ima-modsig" | "d-ng|n-ng|sig|d-modsig|modsig" => {
            Err("ima-modsig records appended signatures, which verilay does not read")
        }
        "evm-sig" | "d-ng|n-ng|evmsig|xattrnames|xattrlengths|xattrvalues|iuid|igid|imode" => {
            Err("evm-sig records EVM data, which verilay does not keep")
        }
        _ if value.contains('|') || is_template_field(value) => {
            Err("custom template formats are not supported; use ima-ng, ima-ngv2, ima-sig or ima-sigv2")
        }
        _ => Err("unknown template"),
    }
}

/// The kernel's template field ids (`ima_template.c`, `supported_fields`).
fn is_template_field(s: &str) -> bool {
    matches!(
        s,
        "d" | "n"
            | "d-ng"
            | "d-ngv2"
            | "n-ng"
            | "sig"
            | "buf"
            | "d-modsig"
            | "modsig"
            | "evmsig"
            | "iuid"
            | "igid"
            | "imode"
            | "xattrnames"
            | "xattrlengths"
            | "xattrvalues"
    )
}

fn is_overflow(e: &std::num::ParseIntError) -> bool {
    matches!(
        e.kind(),
        std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow
    )
}

/// A decimal uid/gid as `kstrtoul(.., 10, ..)` reads it. (uid_t)-1 is refused as the
/// kernel does: `make_kuid` maps it to INVALID_UID and `uid_valid` fails.
fn parse_id(s: &str) -> Result<u32, &'static str> {
    const RANGE: &str = "id out of range (0-4294967294; 4294967295 is the invalid id)";
    match s.parse::<u32>() {
        Ok(u32::MAX) => Err(RANGE),
        Ok(id) => Ok(id),
        Err(er) if *er.kind() == std::num::IntErrorKind::Empty => Err("empty value"),
        Err(er) if is_overflow(&er) => Err(RANGE),
        Err(_) => Err("not a decimal id"),
    }
}

/// Hex as `kstrtoul(.., 16, ..)` reads it: optional '+', optional 0x, hex digits.
fn parse_hex(s: &str) -> Result<u64, &'static str> {
    let s = s.strip_prefix('+').unwrap_or(s);
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("not a hex number");
    }
    u64::from_str_radix(digits, 16).map_err(|_| "does not fit in 64 bits")
}

/// A uuid as policies write it (`uuid_parse`'s form): 8-4-4-4-12 lowercase hex digits.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let h = hex::encode(u);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// `uuid_parse`: 8-4-4-4-12 hex digits, either case, bytes in text order.
fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    let mut hex = Vec::with_capacity(32);
    for (i, &c) in b.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return None;
            }
        } else {
            hex.push(char::from(c).to_digit(16)?);
        }
    }
    for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        // Each digit is below 16, so the byte cannot overflow.
        *o = (pair[0] * 16 + pair[1]) as u8;
    }
    Some(out)
}
