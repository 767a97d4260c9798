//! An independent checker of what Postern hands a witness: RFC 6962 Merkle tree heads and proofs,
//! and C2SP signed notes and checkpoints. Written from the texts (RFC 6962 §2.1, c2sp.org/
//! signed-note, c2sp.org/tlog-checkpoint, c2sp.org/tlog-witness), sharing no code with Postern:
//! the tree is recomputed from its definition and the proofs are checked by rebuilding both
//! roots from the recursive definitions of PATH and SUBPROOF (Postern generates them with those
//! recursions and verifies with RFC 9162's loops), so one cannot mask a mistake in the other.

use base64::Engine as _;
use sha2::{Digest, Sha256};

pub type Hash = [u8; 32];

fn sha256(parts: &[&[u8]]) -> Hash {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

/// `MTH({d})` of one entry.
pub fn leaf(data: &[u8]) -> Hash {
    sha256(&[&[0u8], data])
}

fn node(left: &Hash, right: &Hash) -> Hash {
    sha256(&[&[1u8], left, right])
}

/// The largest power of two smaller than `n` (`n > 1`).
fn k_of(n: usize) -> usize {
    let mut k = 1;
    while k * 2 < n {
        k *= 2;
    }
    k
}

/// `MTH(D[n])` from the leaf hashes (RFC 6962 §2.1).
pub fn mth(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => sha256(&[]),
        1 => leaves[0],
        n => {
            let k = k_of(n);
            node(&mth(&leaves[..k]), &mth(&leaves[k..]))
        }
    }
}

/// Whether `proof` is `PATH(index, D[size])` for a leaf hashing to `leaf`, in a tree with root
/// `root`.
pub fn inclusion_holds(leaf: &Hash, index: usize, size: usize, proof: &[Hash], root: &Hash) -> bool {
    // PATH(m, D[n]) ends with the sibling of the top split: rebuild from the end of the proof.
    fn rebuild(m: usize, n: usize, leaf: &Hash, proof: &[Hash]) -> Option<Hash> {
        if n == 1 {
            return proof.is_empty().then_some(*leaf);
        }
        let (last, rest) = proof.split_last()?;
        let k = k_of(n);
        Some(if m < k {
            node(&rebuild(m, k, leaf, rest)?, last)
        } else {
            node(last, &rebuild(m - k, n - k, leaf, rest)?)
        })
    }
    index < size && rebuild(index, size, leaf, proof).as_ref() == Some(root)
}

/// Whether `proof` is `PROOF(old, D[new])` between the two roots.
pub fn consistency_holds(old: usize, new: usize, old_root: &Hash, new_root: &Hash, proof: &[Hash]) -> bool {
    // SUBPROOF(m, D[n], b), rebuilt from the end: both the old tree's hash within this subtree
    // (when the old tree lies in it) and the new subtree's hash.
    fn rebuild(m: usize, n: usize, whole: bool, old_root: &Hash, proof: &[Hash]) -> Option<(Hash, Hash)> {
        if m == n {
            return if whole {
                proof.is_empty().then_some((*old_root, *old_root))
            } else {
                match proof {
                    [h] => Some((*h, *h)),
                    _ => None,
                }
            };
        }
        let (last, rest) = proof.split_last()?;
        let k = k_of(n);
        if m <= k {
            let (o, n_hash) = rebuild(m, k, whole, old_root, rest)?;
            Some((o, node(&n_hash, last)))
        } else {
            let (o, n_hash) = rebuild(m - k, n - k, false, old_root, rest)?;
            Some((node(last, &o), node(last, &n_hash)))
        }
    }
    if old > new {
        return false;
    }
    if old == new {
        return proof.is_empty() && old_root == new_root;
    }
    if old == 0 {
        // The empty tree's root is the hash of the empty string.
        return proof.is_empty() && *old_root == sha256(&[]);
    }
    matches!(rebuild(old, new, true, old_root, proof), Some((o, n)) if o == *old_root && n == *new_root)
}

/// A signed note split into its text and signature lines (c2sp.org/signed-note).
#[derive(Debug, Clone)]
pub struct Note {
    /// Ends with a newline; excludes the blank separator line.
    pub text: String,
    pub signatures: Vec<(String, [u8; 4], Vec<u8>)>,
}

/// Parses a signed note, or says what is wrong with it.
pub fn parse_note(note: &str) -> Result<Note, String> {
    if note.chars().any(|c| c.is_control() && c != '\n') {
        return Err("a control character other than newline".into());
    }
    let split = note.rfind("\n\n").ok_or("no blank line before the signatures")?;
    let text = note[..=split].to_owned();
    let mut signatures = Vec::new();
    for line in note[split + 2..].split_terminator('\n') {
        let rest = line.strip_prefix("\u{2014} ").ok_or_else(|| format!("not a signature line: {line:?}"))?;
        let (name, sig) = rest.split_once(' ').ok_or("a signature line without a signature")?;
        if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '+') {
            return Err(format!("{name:?} is not a key name"));
        }
        let bytes = base64::engine::general_purpose::STANDARD.decode(sig).map_err(|e| e.to_string())?;
        if bytes.len() < 5 {
            return Err("a signature shorter than its key ID".into());
        }
        signatures.push((name.to_owned(), bytes[..4].try_into().unwrap(), bytes[4..].to_vec()));
    }
    if !note.ends_with('\n') || signatures.is_empty() {
        return Err("no signature lines, or no final newline".into());
    }
    Ok(Note { text, signatures })
}

/// The key ID the signed-note text recommends for an Ed25519 key.
pub fn key_id(name: &str, public_key: &[u8; 32]) -> [u8; 4] {
    sha256(&[name.as_bytes(), b"\n", &[0x01], public_key])[..4].try_into().unwrap()
}

/// A verifier key `name+hex(id)+base64(0x01 || key)`, read into its parts.
pub fn read_vkey(vkey: &str) -> Result<(String, [u8; 4], [u8; 32]), String> {
    let mut parts = vkey.trim().splitn(3, '+');
    let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("not name+id+key".into());
    };
    let id: [u8; 4] = hex::decode(id).map_err(|e| e.to_string())?.try_into().map_err(|_| "id is not 4 bytes")?;
    let key = base64::engine::general_purpose::STANDARD.decode(key).map_err(|e| e.to_string())?;
    let (&[0x01], public) = key.split_at(1) else { return Err("not an Ed25519 key (type byte)".into()) };
    let public: [u8; 32] = public.try_into().map_err(|_| "the key is not 32 bytes")?;
    if key_id(name, &public) != id {
        return Err("the key ID is not the key's".into());
    }
    Ok((name.to_owned(), id, public))
}

/// Checks the note carries a valid Ed25519 signature by the key `vkey` names.
pub fn note_signed_by(note: &Note, vkey: &str) -> Result<(), String> {
    let (name, id, public) = read_vkey(vkey)?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(&public).map_err(|e| e.to_string())?;
    let (_, _, sig) =
        note.signatures.iter().find(|(n, i, _)| *n == name && *i == id).ok_or("no signature by that key")?;
    let sig = ed25519_dalek::Signature::from_slice(sig).map_err(|e| e.to_string())?;
    key.verify_strict(note.text.as_bytes(), &sig).map_err(|e| e.to_string())
}

/// The origin, size and root a checkpoint's text says (c2sp.org/tlog-checkpoint).
pub fn read_checkpoint(note: &Note) -> Result<(String, u64, Hash), String> {
    let lines: Vec<&str> = note.text.split_terminator('\n').collect();
    let [origin, size, root, extensions @ ..] = lines.as_slice() else { return Err("fewer than three lines".into()) };
    if origin.is_empty() || origin.contains(char::is_whitespace) || origin.contains('+') {
        return Err("the origin is empty or holds a space or a plus".into());
    }
    if extensions.iter().any(|l| l.is_empty()) {
        return Err("an empty extension line".into());
    }
    if size.is_empty() || !size.bytes().all(|b| b.is_ascii_digit()) || (size.len() > 1 && size.starts_with('0')) {
        return Err("the size is not decimal digits without a leading zero".into());
    }
    let size: u64 = size.parse().map_err(|e| format!("size: {e}"))?;
    let root = base64::engine::general_purpose::STANDARD.decode(root).map_err(|e| format!("root: {e}"))?;
    Ok(((*origin).to_owned(), size, root.try_into().map_err(|_| "the root is not 32 bytes")?))
}

/// A tlog-witness `add-checkpoint` request body: the old size, the consistency proof, and the
/// new checkpoint note.
pub fn read_witness_request(body: &str) -> Result<(u64, Vec<Hash>, Note), String> {
    let (head, note) = body.split_once("\n\n").ok_or("no blank line after the proof")?;
    let mut lines = head.split('\n');
    let old = lines.next().and_then(|l| l.strip_prefix("old ")).ok_or("no `old N` line")?;
    if old.is_empty() || !old.bytes().all(|b| b.is_ascii_digit()) || (old.len() > 1 && old.starts_with('0')) {
        return Err("the old size is not decimal digits without a leading zero".into());
    }
    let old: u64 = old.parse().map_err(|e| format!("old size: {e}"))?;
    let proof = lines
        .map(|l| {
            let h = base64::engine::general_purpose::STANDARD.decode(l).map_err(|e| e.to_string())?;
            h.try_into().map_err(|_| "a proof line is not 32 bytes".to_owned())
        })
        .collect::<Result<Vec<Hash>, String>>()?;
    if proof.len() > 63 {
        return Err("more than 63 proof lines".into());
    }
    Ok((old, proof, parse_note(note)?))
}
