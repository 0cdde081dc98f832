//! Decoding never panics: valid requests of every opcode, mutated (bytes flipped, cut,
//! extended, lengths and opcodes rewritten) and random buffers go through both transports'
//! splitting and the decoder. Bounded and seeded, so a failure replays.

mod common;

use common::wire::samples;
use fusewire::{decode, split_dev, split_uring, Request};

#[path = "../../erofs/tests/common/xorshift.rs"]
mod xorshift;
// xorshift64*: deterministic, no dependency.
use xorshift::XorShiftStar as Rng;

fn mutate(rng: &mut Rng, buf: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !buf.is_empty() => {
                let i = rng.below(buf.len());
                buf[i] ^= 1 << rng.below(8);
            }
            1 => buf.truncate(rng.below(buf.len() + 1)),
            2 => buf.extend((0..rng.below(40)).map(|_| rng.next_u64() as u8)),
            // The header's length: right, or anything.
            3 if buf.len() >= 4 => {
                let len = if rng.below(2) == 0 {
                    buf.len() as u32
                } else {
                    rng.next_u64() as u32
                };
                buf[..4].copy_from_slice(&len.to_ne_bytes());
            }
            4 if buf.len() >= 8 => buf[4..8].copy_from_slice(&(rng.below(64) as u32).to_ne_bytes()),
            5 if buf.len() >= 40 => {
                buf[36..38].copy_from_slice(&(rng.below(8) as u16).to_ne_bytes())
            }
            _ if !buf.is_empty() => {
                let i = rng.below(buf.len());
                buf[i] = [0, 0xff, b'/', 0x80][rng.below(4)];
            }
            _ => {}
        }
    }
}

/// Everything a handler would touch, so nothing is optimised away.
fn touch(req: &Request<'_>) -> usize {
    req.forgets().count() + req.reply_limit().unwrap_or(0) + usize::from(req.wants_reply())
}

#[test]
fn mutated_and_random_buffers_never_panic() {
    let seeds: Vec<Vec<u8>> = samples().iter().map(|s| s.dev()).collect();
    let mut rng = Rng(0x5eed_f05e_3a11_0001);
    let (mut decoded, mut refused) = (0usize, 0usize);
    for round in 0..200_000 {
        let mut buf = if round % 10 == 0 {
            (0..rng.below(200)).map(|_| rng.next_u64() as u8).collect()
        } else {
            seeds[rng.below(seeds.len())].clone()
        };
        mutate(&mut rng, &mut buf);
        for ext in [false, true] {
            match split_dev(&buf, ext).and_then(|raw| decode(&raw)) {
                Ok(req) => decoded += touch(&req).min(1),
                Err(e) => refused += e.to_string().len().min(1),
            }
        }
        // The same bytes as a ring entry: header area, first argument, payload of any size.
        let mut hdr = fusewire::abi::UringReqHeader {
            in_out: [0; 128],
            op_in: [0; 128],
            ring_ent_in_out: Default::default(),
        };
        let head = buf.len().min(40);
        hdr.in_out[..head].copy_from_slice(&buf[..head]);
        let arg = buf.len().saturating_sub(40).min(rng.below(129));
        hdr.op_in[..arg].copy_from_slice(&buf[head..head + arg]);
        let payload = buf[head + arg..].to_vec();
        hdr.ring_ent_in_out.payload_sz = match rng.below(3) {
            0 => payload.len() as u32,
            1 => rng.next_u64() as u32,
            _ => rng.below(payload.len() + 2) as u32,
        };
        if let Ok(req) = split_uring(&hdr, &payload).and_then(|raw| decode(&raw)) {
            decoded += touch(&req).min(1);
        }
    }
    // The mutations must leave both kinds: a fuzzer that only ever fails is not fuzzing.
    assert!(
        decoded > 1000 && refused > 1000,
        "decoded {decoded}, refused {refused}"
    );
}
