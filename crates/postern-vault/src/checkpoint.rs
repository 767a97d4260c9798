//! Signing what the journal says: checkpoints of its head with the installation's
//! journal-signing key (an Ed25519 key kept in the keychain), in the JSON format and as a C2SP
//! checkpoint note ([`crate::note`]), and checking a JSON checkpoint's signature offline.

use crate::note::{self, VerifierKey};
use crate::{Vault, VaultError};
use ed25519_dalek::{Signer, SigningKey, Verifier, VerifyingKey};
use postern_store::{Checkpoint, Checkpointed};

impl Vault {
    fn signing_key(&self) -> Result<SigningKey, VaultError> {
        Ok(SigningKey::from_bytes(self.key_material("journal-signing-key")?.expose()))
    }

    /// The public half of the journal-signing key, hex: keep it off the machine with the
    /// checkpoints, and pass it to `postern audit verify --pubkey`.
    pub fn journal_public_key(&self) -> Result<String, VaultError> {
        Ok(hex::encode(self.signing_key()?.verifying_key().to_bytes()))
    }

    /// The origin of this installation's checkpoints, and the name of the key that signs them:
    /// `postern/<installation id>`.
    pub fn checkpoint_origin(&self) -> String {
        format!("postern/{}", self.installation_id())
    }

    /// The journal-signing key as a note verifier key (`name+keyid+base64`), the form a witness
    /// is configured with and `postern audit verify --pubkey` takes.
    pub fn journal_verifier_key(&self) -> Result<VerifierKey, VaultError> {
        Ok(VerifierKey::new(&self.checkpoint_origin(), self.signing_key()?.verifying_key()))
    }

    /// Signs a checkpoint with the journal-signing key: the chain's head in the JSON format, and
    /// the Merkle tree's head as a C2SP checkpoint note (when the journal has a tree to sign).
    pub fn sign_checkpoint(&self, checkpointed: Checkpointed) -> Result<Signed, VaultError> {
        let key = self.signing_key()?;
        let Checkpointed { journal: mut checkpoint, tree } = checkpointed;
        checkpoint.signature = Some(hex::encode(key.sign(&checkpoint.signed_bytes()).to_bytes()));
        checkpoint.public_key = Some(hex::encode(key.verifying_key().to_bytes()));
        let origin = self.checkpoint_origin();
        let note = tree.and_then(|tree| {
            let text = note::checkpoint_text(&origin, tree).map_err(|e| e.to_string())?;
            Ok(note::sign(&text, &origin, &key))
        });
        let (note, no_note) = match note {
            Ok(note) => (Some(note), None),
            Err(why) => (None, Some(why)),
        };
        Ok(Signed { checkpoint, note, no_note })
    }
}

/// A signed checkpoint: the JSON format (the chain's head, `postern-checkpoint/1`) and the C2SP
/// checkpoint note (the Merkle tree's head) of the same journal size.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Signed {
    pub checkpoint: Checkpoint,
    /// The note, unless the journal has no tree to sign ...
    pub note: Option<String>,
    /// ... and then why.
    pub no_note: Option<String>,
}

impl Signed {
    /// The note, or why there is none.
    pub fn note(&self) -> Result<&str, String> {
        self.note.as_deref().ok_or_else(|| {
            format!(
                "no checkpoint note: {} (`postern audit checkpoint --json` still records the chain's head)",
                self.no_note.as_deref().unwrap_or("the journal has no Merkle tree")
            )
        })
    }
}

/// Why a checkpoint's signature does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureProblem {
    #[error("the checkpoint is not signed")]
    Unsigned,
    #[error("{0:?} is not an Ed25519 public key (64 hex digits)")]
    BadPublicKey(String),
    #[error("the checkpoint was signed by key {found}, not by the trusted key {trusted}")]
    WrongSigner { found: String, trusted: String },
    #[error("the signature does not match the checkpoint's contents (it was altered after signing)")]
    Invalid,
}

/// Checks `checkpoint` was signed by `trusted_public_key` (hex). Needs no keychain.
pub fn verify_checkpoint_signature(checkpoint: &Checkpoint, trusted_public_key: &str) -> Result<(), SignatureProblem> {
    let trusted = trusted_public_key.trim().to_ascii_lowercase();
    let key_bytes: [u8; 32] = hex::decode(&trusted)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| SignatureProblem::BadPublicKey(trusted.clone()))?;
    let key = VerifyingKey::from_bytes(&key_bytes).map_err(|_| SignatureProblem::BadPublicKey(trusted.clone()))?;
    let signature = checkpoint.signature.as_deref().ok_or(SignatureProblem::Unsigned)?;
    if let Some(found) = &checkpoint.public_key
        && found.to_ascii_lowercase() != trusted
    {
        return Err(SignatureProblem::WrongSigner { found: found.clone(), trusted });
    }
    let sig_bytes: [u8; 64] =
        hex::decode(signature).ok().and_then(|b| b.try_into().ok()).ok_or(SignatureProblem::Invalid)?;
    key.verify(&checkpoint.signed_bytes(), &ed25519_dalek::Signature::from_bytes(&sig_bytes))
        .map_err(|_| SignatureProblem::Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::vault;
    use postern_core::Timestamp;

    #[test]
    fn checkpoint_signatures_bind_contents_and_signer() {
        let (_dir, v) = vault();
        let cp = Checkpoint::new(postern_store::JournalHead::EMPTY, Timestamp::from_millis(9));
        let tree = postern_core::merkle::TreeHead { size: 0, root: postern_core::merkle::empty_root() };
        let Signed { checkpoint: signed, note, .. } =
            v.sign_checkpoint(Checkpointed { journal: cp, tree: Ok(tree) }).expect("sign");
        let note = note.expect("a note");
        // The note: this installation's origin, the tree head, and a signature its verifier key
        // checks (and another installation's does not).
        let read = note::SignedNote::parse(&note).expect("a signed note");
        assert_eq!(read.checkpoint().expect("a checkpoint"), (v.checkpoint_origin(), tree));
        read.verify(&v.journal_verifier_key().expect("vkey")).expect("signed by this installation");
        let pk = v.journal_public_key().expect("pk");
        verify_checkpoint_signature(&signed, &pk).expect("valid");
        let mut altered = signed.clone();
        altered.journal_size += 1;
        assert_eq!(verify_checkpoint_signature(&altered, &pk), Err(SignatureProblem::Invalid));
        let (_dir2, other) = vault();
        assert!(read.verify(&other.journal_verifier_key().expect("vkey")).is_err());
        let other_pk = other.journal_public_key().expect("pk");
        assert!(matches!(verify_checkpoint_signature(&signed, &other_pk), Err(SignatureProblem::WrongSigner { .. })));
        let mut stripped = signed;
        stripped.signature = None;
        assert_eq!(verify_checkpoint_signature(&stripped, &pk), Err(SignatureProblem::Unsigned));
        assert!(matches!(verify_checkpoint_signature(&stripped, "zz"), Err(SignatureProblem::BadPublicKey(_))));
    }
}
