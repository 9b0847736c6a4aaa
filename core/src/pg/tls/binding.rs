//! `tls-server-end-point` channel binding (RFC 5929 §4.1): a hash of the
//! server's certificate, with the hash its signature algorithm uses (SHA-256
//! where that is MD5 or SHA-1). The server computes the same value; if the
//! two differ, SCRAM-SHA-256-PLUS fails, so a wrong hash cannot pass
//! silently, but a missing one would quietly downgrade to plain SCRAM.

use sha2::{Digest, Sha224, Sha256, Sha384, Sha512};

/// One DER element: its tag, its content and what follows it.
fn element(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    let (&first, b) = b.split_first()?;
    let (len, b) = if first < 0x80 {
        (usize::from(first), b)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let len = b[..n]
            .iter()
            .fold(0usize, |l, &d| (l << 8) | usize::from(d));
        (len, &b[n..])
    };
    (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
}

const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hash {
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

const RSA_PKCS1: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
const RSA_PSS: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a];
const ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04];
const NIST_HASH: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02];
const SHA1: &[u8] = &[0x2b, 0x0e, 0x03, 0x02, 0x1a];

/// The hash named by a signature algorithm identifier's OID (and, for
/// RSASSA-PSS, its parameters); `None` for one without a hash of its own
/// (Ed25519), where the binding is undefined.
fn hash_of(oid: &[u8], params: &[u8]) -> Option<Hash> {
    if oid == RSA_PSS {
        return pss_hash(params);
    }
    if let Some(&[n]) = oid.strip_prefix(RSA_PKCS1) {
        return match n {
            0x04 | 0x05 | 0x0b => Some(Hash::Sha256), // MD5, SHA-1, SHA-256
            0x0c => Some(Hash::Sha384),
            0x0d => Some(Hash::Sha512),
            0x0e => Some(Hash::Sha224),
            _ => None,
        };
    }
    match oid.strip_prefix(ECDSA)? {
        [0x01] => Some(Hash::Sha256), // ecdsa-with-SHA1
        [0x03, 0x01] => Some(Hash::Sha224),
        [0x03, 0x02] => Some(Hash::Sha256),
        [0x03, 0x03] => Some(Hash::Sha384),
        [0x03, 0x04] => Some(Hash::Sha512),
        _ => None,
    }
}

/// RSASSA-PSS-params: `[0] hashAlgorithm` first, SHA-1 when absent.
fn pss_hash(params: &[u8]) -> Option<Hash> {
    let (tag, seq, _) = element(params)?;
    if tag != SEQUENCE {
        return None;
    }
    let Some((0xa0, explicit, _)) = element(seq) else {
        return Some(Hash::Sha256);
    };
    let (SEQUENCE, alg, _) = element(explicit)? else {
        return None;
    };
    let (OID, oid, _) = element(alg)? else {
        return None;
    };
    if oid == SHA1 {
        return Some(Hash::Sha256);
    }
    match oid.strip_prefix(NIST_HASH)? {
        [0x01] => Some(Hash::Sha256),
        [0x02] => Some(Hash::Sha384),
        [0x03] => Some(Hash::Sha512),
        [0x04] => Some(Hash::Sha224),
        _ => None,
    }
}

/// The certificate's outer `signatureAlgorithm` (after `tbsCertificate`).
fn signature_hash(cert: &[u8]) -> Option<Hash> {
    let (SEQUENCE, body, _) = element(cert)? else {
        return None;
    };
    let (SEQUENCE, _tbs, rest) = element(body)? else {
        return None;
    };
    let (SEQUENCE, alg, _) = element(rest)? else {
        return None;
    };
    let (OID, oid, params) = element(alg)? else {
        return None;
    };
    hash_of(oid, params)
}

/// The `tls-server-end-point` value of a DER certificate; `None` where it
/// is undefined or the certificate cannot be read.
pub(crate) fn end_point(cert: &[u8]) -> Option<Vec<u8>> {
    Some(match signature_hash(cert)? {
        Hash::Sha224 => Sha224::digest(cert).to_vec(),
        Hash::Sha256 => Sha256::digest(cert).to_vec(),
        Hash::Sha384 => Sha384::digest(cert).to_vec(),
        Hash::Sha512 => Sha512::digest(cert).to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate skeleton: SEQUENCE { tbs, algorithm, signature }.
    fn cert(alg: &[u8]) -> Vec<u8> {
        let mut body = vec![SEQUENCE, 3, 0x02, 0x01, 0x01];
        body.extend_from_slice(alg);
        body.extend_from_slice(&[0x03, 0x02, 0x00, 0xff]);
        let mut c = vec![SEQUENCE, body.len() as u8];
        c.extend(body);
        c
    }

    fn alg(oid: &[u8], params: &[u8]) -> Vec<u8> {
        let mut inner = vec![OID, oid.len() as u8];
        inner.extend_from_slice(oid);
        inner.extend_from_slice(params);
        let mut a = vec![SEQUENCE, inner.len() as u8];
        a.extend(inner);
        a
    }

    #[test]
    fn the_hash_follows_the_signature_algorithm() {
        let cases: &[(&[u8], Option<Hash>)] = &[
            (
                &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b],
                Some(Hash::Sha256),
            ),
            (
                &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c],
                Some(Hash::Sha384),
            ),
            (
                &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d],
                Some(Hash::Sha512),
            ),
            (
                &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05],
                Some(Hash::Sha256),
            ),
            (
                &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03],
                Some(Hash::Sha384),
            ),
            (
                &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01],
                Some(Hash::Sha256),
            ),
            (&[0x2b, 0x65, 0x70], None), // Ed25519
        ];
        for (oid, want) in cases {
            assert_eq!(
                signature_hash(&cert(&alg(oid, &[0x05, 0x00]))),
                *want,
                "{oid:02x?}"
            );
        }
    }

    #[test]
    fn pss_reads_its_parameters() {
        let sha384 = alg(&[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02], &[]);
        let mut explicit = vec![0xa0, sha384.len() as u8];
        explicit.extend(sha384);
        let mut params = vec![SEQUENCE, explicit.len() as u8];
        params.extend(explicit);
        assert_eq!(
            signature_hash(&cert(&alg(RSA_PSS, &params))),
            Some(Hash::Sha384)
        );
        assert_eq!(
            signature_hash(&cert(&alg(RSA_PSS, &[SEQUENCE, 0]))),
            Some(Hash::Sha256)
        );
    }

    #[test]
    fn garbage_is_none_not_a_panic() {
        for b in [
            &[][..],
            &[0x30],
            &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
            &[0x30, 0x05, 0x30],
        ] {
            assert_eq!(end_point(b), None);
        }
    }
}
