//! Nonces for holder records without a system call per acquisition: a
//! ChaCha20 keystream per thread, keyed once from `getrandom` and keyed again
//! after a fork (a child must never repeat its parent's nonces).

use std::cell::Cell;

use crate::registry;

struct Stream {
    key: [u32; 8],
    counter: u64,
    epoch: u64,
}

thread_local! {
    static STREAM: Cell<Option<Stream>> = const { Cell::new(None) };
}

/// 16 fresh random bytes, as 32 lowercase hex digits.
pub(crate) fn fresh_hex() -> std::io::Result<String> {
    let epoch = registry::epoch();
    let block = STREAM.with(|cell| -> std::io::Result<[u32; 16]> {
        let mut s = match cell.take() {
            Some(s) if s.epoch == epoch => s,
            _ => Stream {
                key: seed()?,
                counter: 0,
                epoch,
            },
        };
        let out = block(&s.key, [s.counter as u32, (s.counter >> 32) as u32, 0, 0]);
        s.counter += 1;
        cell.set(Some(s));
        Ok(out)
    })?;
    let mut hex = String::with_capacity(32);
    for word in &block[..4] {
        for b in word.to_le_bytes() {
            const DIGITS: &[u8; 16] = b"0123456789abcdef";
            hex.push(DIGITS[(b >> 4) as usize] as char);
            hex.push(DIGITS[(b & 15) as usize] as char);
        }
    }
    Ok(hex)
}

fn seed() -> std::io::Result<[u32; 8]> {
    let mut bytes = [0u8; 32];
    crate::platform::random::fill(&mut bytes)?;
    let mut key = [0u32; 8];
    for (k, chunk) in key.iter_mut().zip(bytes.chunks_exact(4)) {
        *k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
    Ok(key)
}

/// The ChaCha20 block function (RFC 8439): key, then counter and nonce
/// words. The stream uses a 64-bit counter and a zero nonce, so each key
/// gives 2^64 distinct blocks.
fn block(key: &[u32; 8], tail: [u32; 4]) -> [u32; 16] {
    let mut init = [0u32; 16];
    init[..4].copy_from_slice(&[0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574]);
    init[4..12].copy_from_slice(key);
    init[12..].copy_from_slice(&tail);
    let mut s = init;
    for _ in 0..10 {
        quarter(&mut s, 0, 4, 8, 12);
        quarter(&mut s, 1, 5, 9, 13);
        quarter(&mut s, 2, 6, 10, 14);
        quarter(&mut s, 3, 7, 11, 15);
        quarter(&mut s, 0, 5, 10, 15);
        quarter(&mut s, 1, 6, 11, 12);
        quarter(&mut s, 2, 7, 8, 13);
        quarter(&mut s, 3, 4, 9, 14);
    }
    for (o, i) in s.iter_mut().zip(init) {
        *o = o.wrapping_add(i);
    }
    s
}

fn quarter(s: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize) {
    s[a] = s[a].wrapping_add(s[b]);
    s[d] = (s[d] ^ s[a]).rotate_left(16);
    s[c] = s[c].wrapping_add(s[d]);
    s[b] = (s[b] ^ s[c]).rotate_left(12);
    s[a] = s[a].wrapping_add(s[b]);
    s[d] = (s[d] ^ s[a]).rotate_left(8);
    s[c] = s[c].wrapping_add(s[d]);
    s[b] = (s[b] ^ s[c]).rotate_left(7);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc8439_block_function() {
        // RFC 8439 §2.3.2: key 00..1f, counter 1, nonce 09000000 4a000000 0.
        let key: [u32; 8] = std::array::from_fn(|i| {
            let b = 4 * i as u8;
            u32::from_le_bytes([b, b + 1, b + 2, b + 3])
        });
        let out = block(&key, [1, 0x0900_0000, 0x4a00_0000, 0]);
        assert_eq!(
            out,
            [
                0xe4e7_f110,
                0x1559_3bd1,
                0x1fdd_0f50,
                0xc471_20a3,
                0xc7f4_d1c7,
                0x0368_c033,
                0x9aaa_2204,
                0x4e6c_d4c3,
                0x4664_82d2,
                0x09aa_9f07,
                0x05d7_c214,
                0xa202_8bd9,
                0xd19c_12b5,
                0xb94e_16de,
                0xe883_d0cb,
                0x4e3c_50a2
            ]
        );
    }

    #[test]
    fn nonces_differ() {
        let a = fresh_hex().unwrap();
        let b = fresh_hex().unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}
