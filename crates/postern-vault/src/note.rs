//! Checkpoints in the format transparency-log witnesses read: a C2SP signed note
//! (c2sp.org/signed-note) whose text is a tlog checkpoint (c2sp.org/tlog-checkpoint) — the
//! origin naming the installation, the Merkle tree's size and root — signed with the
//! journal-signing key (Ed25519, key ID as the note spec computes it). Writing, reading and
//! checking them needs no keychain; signing is [`crate::Vault::sign_checkpoint`].

use base64::Engine as _;
use ed25519_dalek::{Signer, SigningKey, Verifier, VerifyingKey};
use postern_core::merkle::TreeHead;
use sha2::{Digest, Sha256};

/// The signature type byte of Ed25519 in the signed-note spec.
const ED25519: u8 = 0x01;

/// The longest note read (a checkpoint is about 200 bytes; the spec asks verifiers to accept at
/// least 16 signatures, of up to ~5 kB each for post-quantum ones).
pub const MAX_NOTE_BYTES: usize = 128 * 1024;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// Why a note or a verifier key does not read, or a note is not signed as it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    #[error("not a signed note: {0}")]
    Malformed(String),
    #[error("not a checkpoint: {0}")]
    NotACheckpoint(String),
    #[error("{0:?} is not a verifier key (name+keyid+base64 key, as `postern audit pubkey --vkey` prints)")]
    BadKey(String),
    #[error("the note carries no signature by {0} (another installation's checkpoint, or signed with another key)")]
    NotSignedBy(String),
    #[error("the signature by {0} does not match the note's text (it was altered after signing)")]
    Invalid(String),
}

impl postern_core::ErrorCode for NoteError {
    fn code(&self) -> &'static str {
        match self {
            NoteError::Malformed(_) => "note_malformed",
            NoteError::NotACheckpoint(_) => "not_a_checkpoint",
            NoteError::BadKey(_) => "bad_verifier_key",
            NoteError::NotSignedBy(_) => "note_not_signed_by_key",
            NoteError::Invalid(_) => "note_signature_invalid",
        }
    }
}

/// A key name as the spec allows it: not empty, no Unicode space, no plus.
fn name_ok(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(|c| c.is_whitespace() || c == '+' || c.is_control())
}

/// `SHA-256(key name || 0x0A || 0x01 || public key)[:4]`.
pub fn key_id(name: &str, public: &VerifyingKey) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update([b'\n', ED25519]);
    h.update(public.as_bytes());
    let digest = h.finalize();
    [digest[0], digest[1], digest[2], digest[3]]
}

/// A key that checks notes: its name, its ID and its Ed25519 public half.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifierKey {
    pub name: String,
    pub id: [u8; 4],
    pub key: VerifyingKey,
}

impl VerifierKey {
    pub fn new(name: &str, key: VerifyingKey) -> VerifierKey {
        VerifierKey { name: name.to_owned(), id: key_id(name, &key), key }
    }

    /// A bare Ed25519 public key (64 hex digits) under `name`.
    pub fn from_hex(name: &str, hex_key: &str) -> Result<VerifierKey, NoteError> {
        let bad = || NoteError::BadKey(hex_key.chars().take(200).collect());
        let bytes: [u8; 32] = hex::decode(hex_key.trim()).ok().and_then(|b| b.try_into().ok()).ok_or_else(bad)?;
        Ok(VerifierKey::new(name, VerifyingKey::from_bytes(&bytes).map_err(|_| bad())?))
    }

    /// The public key in hex (the JSON checkpoint format's spelling).
    pub fn hex(&self) -> String {
        hex::encode(self.key.as_bytes())
    }

    /// Reads `name+hex(keyid)+base64(0x01 || key)`, the form witnesses are configured with; the
    /// key ID must be the key's.
    pub fn parse(text: &str) -> Result<VerifierKey, NoteError> {
        let bad = || NoteError::BadKey(text.chars().take(200).collect());
        let mut parts = text.trim().splitn(3, '+');
        let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else { return Err(bad()) };
        let id: [u8; 4] = hex::decode(id).ok().and_then(|b| b.try_into().ok()).ok_or_else(bad)?;
        let key = b64().decode(key).map_err(|_| bad())?;
        let [ED25519, public @ ..] = key.as_slice() else { return Err(bad()) };
        let public: [u8; 32] = public.try_into().map_err(|_| bad())?;
        let key = VerifyingKey::from_bytes(&public).map_err(|_| bad())?;
        if !name_ok(name) || key_id(name, &key) != id {
            return Err(bad());
        }
        Ok(VerifierKey { name: name.to_owned(), id, key })
    }
}

impl std::fmt::Display for VerifierKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut key = vec![ED25519];
        key.extend_from_slice(self.key.as_bytes());
        write!(f, "{}+{}+{}", self.name, hex::encode(self.id), b64().encode(key))
    }
}

/// The text of a checkpoint of the tree `head` under `origin` (no extension lines). The origin
/// is also the key's name: one the spec does not allow (a space, a plus, a control character) is
/// refused, never written into signed text.
pub fn checkpoint_text(origin: &str, head: TreeHead) -> Result<String, NoteError> {
    if !name_ok(origin) {
        return Err(NoteError::Malformed(format!(
            "the origin {:?} is not a key name (no spaces, plus signs or control characters)",
            origin.chars().take(80).collect::<String>()
        )));
    }
    Ok(format!("{origin}\n{}\n{}\n", head.size, b64().encode(head.root)))
}

/// `text` signed by `key` under `name`.
pub(crate) fn sign(text: &str, name: &str, key: &SigningKey) -> String {
    let mut signature = key_id(name, &key.verifying_key()).to_vec();
    signature.extend_from_slice(&key.sign(text.as_bytes()).to_bytes());
    format!("{text}\n\u{2014} {name} {}\n", b64().encode(signature))
}

/// One signature line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoteSignature {
    pub name: String,
    pub id: [u8; 4],
    pub signature: Vec<u8>,
}

/// A signed note, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedNote {
    /// The signed text: every line up to the last blank line, with its final newline.
    pub text: String,
    pub signatures: Vec<NoteSignature>,
}

impl SignedNote {
    /// Reads a signed note (nothing is checked against a key yet).
    pub fn parse(note: &str) -> Result<SignedNote, NoteError> {
        let bad = |why: &str| Err(NoteError::Malformed(why.to_owned()));
        if note.len() > MAX_NOTE_BYTES {
            return bad("larger than a note may be");
        }
        if note.chars().any(|c| c.is_control() && c != '\n') {
            return bad("it holds a control character other than newline");
        }
        if !note.ends_with('\n') {
            return bad("it does not end with a newline");
        }
        let Some(split) = note.rfind("\n\n") else {
            return bad("no blank line separates the text from the signatures");
        };
        let text = &note[..=split];
        let mut signatures = Vec::new();
        for line in note[split + 2..].split_terminator('\n') {
            let Some((name, signature)) = line.strip_prefix("\u{2014} ").and_then(|l| l.split_once(' ')) else {
                return bad("a line after the blank line is not a signature line (— NAME SIGNATURE)");
            };
            let Ok(bytes) = b64().decode(signature) else { return bad("a signature is not base64") };
            let (id, signature) = match bytes.split_first_chunk::<4>() {
                Some((id, rest)) if name_ok(name) && !rest.is_empty() => (*id, rest.to_vec()),
                _ => return bad("a signature line names no key or carries no signature"),
            };
            signatures.push(NoteSignature { name: name.to_owned(), id, signature });
        }
        if signatures.is_empty() {
            return bad("it carries no signature");
        }
        Ok(SignedNote { text: text.to_owned(), signatures })
    }

    /// Checks the signature by `key` (signatures by other keys are ignored, as the spec says).
    pub fn verify(&self, key: &VerifierKey) -> Result<(), NoteError> {
        let mine: Vec<&NoteSignature> =
            self.signatures.iter().filter(|s| s.name == key.name && s.id == key.id).collect();
        if mine.is_empty() {
            return Err(NoteError::NotSignedBy(key.to_string()));
        }
        for s in mine {
            let signature =
                ed25519_dalek::Signature::from_slice(&s.signature).map_err(|_| NoteError::Invalid(key.name.clone()))?;
            key.key.verify(self.text.as_bytes(), &signature).map_err(|_| NoteError::Invalid(key.name.clone()))?;
        }
        Ok(())
    }

    /// The origin and tree head of a checkpoint's text.
    pub fn checkpoint(&self) -> Result<(String, TreeHead), NoteError> {
        let bad = |why: &str| Err(NoteError::NotACheckpoint(why.to_owned()));
        let lines: Vec<&str> = self.text.split_terminator('\n').collect();
        let [origin, size, root, extensions @ ..] = lines.as_slice() else {
            return bad("fewer than three lines (origin, size, root hash)");
        };
        if origin.is_empty() || extensions.iter().any(|l| l.is_empty()) {
            return bad("an empty origin or extension line");
        }
        if size.is_empty() || !size.bytes().all(|b| b.is_ascii_digit()) || (size.len() > 1 && size.starts_with('0')) {
            return bad("the size is not a decimal number without leading zeroes");
        }
        let Ok(size) = size.parse::<u64>() else { return bad("the size is too large") };
        let Some(root) = b64().decode(root).ok().and_then(|r| <[u8; 32]>::try_from(r).ok()) else {
            return bad("the root hash is not 32 bytes of base64");
        };
        Ok(((*origin).to_owned(), TreeHead { size, root }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    #[test]
    fn a_checkpoint_signs_reads_and_checks() {
        let head = TreeHead { size: 20852163, root: [7; 32] };
        let text = checkpoint_text("postern/inst_01", head).unwrap();
        assert!(checkpoint_text("postern/inst\n01", head).is_err());
        assert!(checkpoint_text("postern/\u{1b}[2J", head).is_err());
        assert_eq!(text, "postern/inst_01\n20852163\nBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\n");
        let note = sign(&text, "postern/inst_01", &key(1));
        let read = SignedNote::parse(&note).unwrap();
        assert_eq!(read.text, text);
        assert_eq!(read.checkpoint().unwrap(), ("postern/inst_01".to_owned(), head));
        let vkey = VerifierKey::new("postern/inst_01", key(1).verifying_key());
        read.verify(&vkey).unwrap();
        assert_eq!(VerifierKey::parse(&vkey.to_string()).unwrap(), vkey);
        // Another key, or the same key under another name, did not sign it.
        let other = VerifierKey::new("postern/inst_01", key(2).verifying_key());
        assert!(matches!(read.verify(&other), Err(NoteError::NotSignedBy(_))));
        let renamed = VerifierKey::new("postern/inst_02", key(1).verifying_key());
        assert!(matches!(read.verify(&renamed), Err(NoteError::NotSignedBy(_))));
        // A key ID that is not the key's is refused when the key is read.
        let mut forged = vkey.to_string();
        forged.replace_range(16..24, "00000000");
        assert!(VerifierKey::parse(&forged).is_err());
    }

    #[test]
    fn hostile_notes_are_refused_with_a_reason() {
        let note = sign("o\n1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n", "o", &key(1));
        for bad in [
            note.replace('\n', "\r\n"),
            note.replace("o\n1", "o\n\u{1b}[2J1"),
            note.trim_end().to_owned(),
            "o\n1\nAAAA\n".to_owned(),
            format!("{note}junk\n"),
            "x".repeat(MAX_NOTE_BYTES + 1),
            note.replace("\u{2014} o ", "\u{2014} o+x "),
        ] {
            assert!(SignedNote::parse(&bad).is_err(), "{bad:?}");
        }
        for text in ["o\n01\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n", "o\n1\n\n", "\n1\nAAAA\n", "o\n1\n"] {
            let n = SignedNote::parse(&sign(text, "o", &key(1))).unwrap();
            assert!(n.checkpoint().is_err(), "{text:?}");
        }
    }

    proptest! {
        /// Whatever the text, a signed note reads back as written, and any change to a byte of its
        /// text fails the signature.
        #[test]
        fn any_change_to_the_text_fails_the_signature(body in "[ -~]{1,60}(\n[ -~]{1,60}){0,3}", at in 0usize..200, to in 32u8..127) {
            let text = format!("{body}\n");
            let note = sign(&text, "postern/x", &key(3));
            let read = SignedNote::parse(&note).unwrap();
            prop_assert_eq!(&read.text, &text);
            let vkey = VerifierKey::new("postern/x", key(3).verifying_key());
            prop_assert!(read.verify(&vkey).is_ok());
            let mut changed = text.clone().into_bytes();
            let i = at % changed.len();
            if changed[i] != b'\n' && changed[i] != to {
                changed[i] = to;
                let altered = SignedNote { text: String::from_utf8(changed).unwrap(), ..read };
                prop_assert!(altered.verify(&vkey).is_err());
            }
        }

        #[test]
        fn the_parser_never_panics(note in "(?s).{0,400}") {
            let _ = SignedNote::parse(&note).map(|n| n.checkpoint());
            let _ = VerifierKey::parse(&note);
        }
    }
}
