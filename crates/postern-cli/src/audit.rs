//! `postern audit …`: the incident responder's commands — verify the journal (against a
//! checkpoint in either format), write a checkpoint (a C2SP checkpoint note, or the JSON
//! format), and prove to a witness or an investigator that the journal extends an older
//! checkpoint or holds a row.

use crate::{Failure, location, render};
use anyhow::{Context, anyhow};
use base64::Engine as _;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use postern_core::merkle;
use postern_host::now;
use postern_store::{Checkpoint, Claim, Store, TreeReader, audit};
use postern_vault::note::{SignedNote, VerifierKey};
use std::{path::Path, process::ExitCode, time::Instant};

/// How far a checkpoint's signature was checked.
enum Signature {
    Trusted,
    /// Valid for the key embedded in the checkpoint, which nothing vouches for.
    SelfConsistent,
    Unsigned,
    /// A note's signature, not checked: no key was given (a note carries none).
    NotChecked,
}

/// A checkpoint file, read: the JSON format (a chain head) or a C2SP checkpoint note (a Merkle
/// tree head, with the origin naming the installation).
enum Exported {
    Json(Checkpoint),
    Note { note: SignedNote, origin: String, tree: merkle::TreeHead },
}

/// A small file read whole, refused past `limit` bytes (a checkpoint or a key named on the
/// command line may be `/dev/zero`).
fn read_small(path: &Path, what: &str, limit: usize) -> Result<String, Failure> {
    use std::io::Read as _;
    let cannot = |e: String| Failure { code: 2, error: anyhow!("cannot read {what} {}: {e}", path.display()) };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limit as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| cannot(e.to_string()))?;
    if bytes.len() > limit {
        return Err(cannot(format!("larger than {limit} bytes")));
    }
    String::from_utf8(bytes).map_err(|_| cannot("not UTF-8 text".into()))
}

impl Exported {
    fn read(path: &Path) -> Result<Exported, Failure> {
        let unusable = |e: String| Failure { code: 2, error: anyhow!("checkpoint {}: {e}", path.display()) };
        let text = read_small(path, "checkpoint", postern_vault::note::MAX_NOTE_BYTES)?;
        if text.trim_start().starts_with('{') {
            return Checkpoint::parse(&text).map(Exported::Json).map_err(unusable);
        }
        let note = SignedNote::parse(&text).map_err(|e| unusable(e.to_string()))?;
        let (origin, tree) = note.checkpoint().map_err(|e| unusable(e.to_string()))?;
        Ok(Exported::Note { note, origin, tree })
    }

    fn claim(&self) -> Claim {
        match self {
            Exported::Json(cp) => Claim::Chain(cp.clone()),
            Exported::Note { tree, .. } => Claim::Tree(*tree),
        }
    }
}

/// The trusted key given as hex or as a verifier key (`name+id+key`), inline or `@FILE`.
fn trusted_key(pubkey: &str) -> Result<String, Failure> {
    match pubkey.strip_prefix('@') {
        Some(file) => read_small(Path::new(file), "the key file", 4096).map(|k| k.trim().to_owned()),
        None => Ok(pubkey.trim().to_owned()),
    }
}

fn check_signature(exported: &Exported, path: &Path, pubkey: Option<&str>) -> Result<Signature, Failure> {
    let unusable = |e: String| Failure { code: 2, error: anyhow!("checkpoint {}: {e}", path.display()) };
    let key = pubkey.map(trusted_key).transpose()?;
    match exported {
        Exported::Json(cp) => match (key, cp.signature.is_some()) {
            (Some(key), _) => {
                // A verifier key names the same Ed25519 key: its hex is what the JSON format holds.
                let hex = match VerifierKey::parse(&key) {
                    Ok(vkey) => vkey.hex(),
                    Err(_) => key,
                };
                postern_vault::verify_checkpoint_signature(cp, &hex).map_err(|e| unusable(e.to_string()))?;
                Ok(Signature::Trusted)
            }
            (None, true) => {
                let embedded = cp.public_key.clone().unwrap_or_default();
                postern_vault::verify_checkpoint_signature(cp, &embedded).map_err(|e| unusable(e.to_string()))?;
                Ok(Signature::SelfConsistent)
            }
            (None, false) => Ok(Signature::Unsigned),
        },
        Exported::Note { note, origin, .. } => {
            let Some(key) = key else { return Ok(Signature::NotChecked) };
            // A bare hex key is named by the note's own origin (which is signed text).
            let vkey = VerifierKey::parse(&key)
                .or_else(|_| VerifierKey::from_hex(origin, &key))
                .map_err(|e| unusable(e.to_string()))?;
            note.verify(&vkey).map_err(|e| unusable(e.to_string()))?;
            Ok(Signature::Trusted)
        }
    }
}

/// A note's origin must be this journal's installation (`postern/<installation id>`).
fn same_installation(db: &Path, origin: &str, path: &Path) -> Result<(), Failure> {
    let ours = postern_store::JournalView::open_read_only(db)?.installation_id()?.map(|id| format!("postern/{id}"));
    if ours.as_deref() != Some(origin) {
        return Err(Failure {
            code: 2,
            error: anyhow!(
                "checkpoint {} is of {} but this journal is {}: another installation's checkpoint",
                path.display(),
                postern_core::Outside::line(origin),
                ours.as_deref().unwrap_or("not yet named")
            ),
        });
    }
    Ok(())
}

pub fn verify(
    db: &Path,
    checkpoint: Option<&Path>,
    pubkey: Option<&str>,
    chain_only: bool,
    json: bool,
) -> Result<ExitCode, Failure> {
    let (checkpoint, signature) = match checkpoint {
        None => (None, None),
        Some(path) => {
            let exported = Exported::read(path)?;
            if let Exported::Note { origin, .. } = &exported {
                same_installation(db, origin, path)?;
            }
            let signature = check_signature(&exported, path, pubkey)?;
            (Some(exported.claim()), Some(signature))
        }
    };
    // Drawn only when stderr is a terminal; scripts get clean output.
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("verifying {wide_bar} {human_pos}/{human_len} rows, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = Instant::now();
    let scope = if chain_only { audit::VerifyScope::ChainOnly } else { audit::VerifyScope::Full };
    let report = audit::verify_with(db, checkpoint.as_ref(), scope, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let report = report?;
    let elapsed = started.elapsed();
    if json {
        let mut value = serde_json::to_value(&report).context("encode report")?;
        value["database"] = serde_json::json!(db.display().to_string());
        value["intact"] = serde_json::json!(report.intact());
        value["elapsed_ms"] = serde_json::json!(elapsed.as_millis() as u64);
        crate::render::print_json(&value).context("encode report")?;
    } else {
        let rate = report.rows as f64 / elapsed.as_secs_f64().max(1e-9);
        println!("database    {}", db.display());
        println!("rows        {}", report.rows);
        println!("executions  {}", report.executions);
        println!("sessions    {}", report.sessions);
        println!("head        {} (row {})", report.head.hash, report.head.size);
        match (&checkpoint, report.checkpoint_checked) {
            (None, _) => {
                println!("checkpoint  none given (a cut-off tail or a rewritten chain needs one to be caught)")
            }
            (Some(cp), true) if report.intact() => {
                let what = if matches!(cp, Claim::Tree(_)) { "Merkle tree root" } else { "chain head" };
                println!("checkpoint  matches ({what} at row {})", cp.size())
            }
            (Some(cp), true) => println!("checkpoint  row {}: does not match", cp.size()),
            (Some(_), false) => println!("checkpoint  not compared (the chain itself is broken)"),
        }
        match signature {
            Some(Signature::Trusted) => println!("signature   valid, by the trusted key"),
            Some(Signature::SelfConsistent) => println!(
                "signature   valid for the key inside the checkpoint; pass --pubkey to check that key is yours"
            ),
            Some(Signature::Unsigned) => println!("signature   none (an unsigned checkpoint proves less)"),
            Some(Signature::NotChecked) => {
                println!("signature   not checked: pass --pubkey with the key `postern audit pubkey --vkey` printed")
            }
            None => {}
        }
        if chain_only {
            println!("scope       chain only (current states and stored results were not compared)");
        }
        println!("elapsed     {:.3} s ({:.0} rows/s)", elapsed.as_secs_f64(), rate);
        if report.intact() {
            println!("result      INTACT");
        } else {
            println!("result      TAMPERING FOUND");
            for finding in &report.findings {
                println!("  - {}", postern_core::Outside::line(&finding.to_string()));
            }
        }
    }
    Ok(if report.intact() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// A new checkpoint, signed by this process or by the running gateway that holds the journal.
fn signed_checkpoint(data_dir: &Path) -> Result<postern_vault::Signed, Failure> {
    let answer = crate::route::perform(data_dir, postern_gateway::door::control::ControlRequest::Checkpoint)?;
    Ok(serde_json::from_value(answer).context("read the checkpoint")?)
}

/// `audit checkpoint`: the C2SP checkpoint note (or, with `json`, the JSON format).
pub fn checkpoint(data_dir: &Path, out: Option<&Path>, json: bool) -> Result<ExitCode, Failure> {
    let signed = signed_checkpoint(data_dir)?;
    let cp = &signed.checkpoint;
    let text = if json {
        serde_json::to_string_pretty(cp).context("encode checkpoint")? + "\n"
    } else {
        signed.note().map_err(|e| Failure { code: 1, error: anyhow!("{e}") })?.to_owned()
    };
    match out {
        Some(path) => {
            std::fs::write(path, &text).with_context(|| format!("write {}", path.display()))?;
            eprintln!(
                "checkpoint of {} rows (head {}, {}) written to {}; keep a copy off this machine, or hand it to a \
                 witness (`postern audit prove --from`)",
                cp.journal_size,
                cp.head_hash,
                render::time(cp.created_at.as_millis()),
                path.display()
            );
        }
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

fn b64(hash: &merkle::Hash) -> String {
    base64::engine::general_purpose::STANDARD.encode(hash)
}

/// A failure of the tree itself (a row or a kept node missing, fewer rows than asked for): the
/// journal was edited, which is tampering found (exit 1), not unusable input.
fn tampered(e: postern_store::StoreError) -> Failure {
    match e {
        postern_store::StoreError::Corrupt(why) => {
            Failure { code: 1, error: anyhow!("{}; run `postern audit verify`", postern_core::Outside::line(&why)) }
        }
        other => other.into(),
    }
}

/// `audit prove --from OLD`: a new checkpoint and the consistency proof from OLD to it, as the
/// body of a tlog-witness `add-checkpoint` request (c2sp.org/tlog-witness). The journal is
/// verified first — its chain, and its tree recomputed from the rows against OLD's root — so
/// rows changed under an unchanged tree are not proved. Exit 1 when it does not verify or does
/// not extend OLD: the proof is printed all the same (a witness refuses what does not extend its
/// record), and stderr says what is wrong.
pub fn prove_from(data_dir: &Path, from: &Path, pubkey: Option<&str>) -> Result<ExitCode, Failure> {
    let db = location::database(data_dir);
    let exported = Exported::read(from)?;
    let Exported::Note { origin, tree: old, .. } = &exported else {
        return Err(Failure {
            code: 2,
            error: anyhow!(
                "checkpoint {} is in the JSON format, which holds no Merkle tree root: a consistency proof needs a \
                 checkpoint note (`postern audit checkpoint` writes one)",
                from.display()
            ),
        });
    };
    same_installation(&db, origin, from)?;
    if matches!(check_signature(&exported, from, pubkey)?, Signature::NotChecked) {
        eprintln!(
            "note: the old checkpoint's signature was not checked (no --pubkey); a witness checks its own record"
        );
    }
    let signed = signed_checkpoint(data_dir)?;
    let note = signed.note().map_err(|e| Failure { code: 1, error: anyhow!("{e}") })?.to_owned();
    let (_, new) = SignedNote::parse(&note)
        .and_then(|n| n.checkpoint())
        .map_err(|e| anyhow!("the new checkpoint does not read: {e}"))?;
    if old.size > new.size {
        return Err(Failure {
            code: 1,
            error: anyhow!(
                "the journal has {} rows, fewer than the {} the checkpoint covers: it was cut off",
                new.size,
                old.size
            ),
        });
    }
    // The journal as it is, against the old checkpoint: chain, kept nodes and the old root.
    let report = audit::verify_with(&db, Some(&Claim::Tree(*old)), audit::VerifyScope::ChainOnly, &mut |_, _| {})?;
    let proof = TreeReader::open(&db)?.consistency(old.size, new.size).map_err(tampered)?;
    let mut body = format!("old {}\n", old.size);
    for hash in &proof.proof {
        body.push_str(&b64(hash));
        body.push('\n');
    }
    body.push('\n');
    body.push_str(&note);
    print!("{body}");
    let extends = merkle::verify_consistency(old.size, new.size, &old.root, &new.root, &proof.proof);
    let mut problems: Vec<String> = report.findings.iter().map(ToString::to_string).collect();
    if proof.new.root != new.root {
        // Rows up to the new size never change: the kept tree on disk is not the one the writer
        // signed (edited behind a running gateway).
        problems.push(format!("the kept tree on disk is not the one signed at row {}", new.size));
    }
    if !extends {
        problems.push(format!("the journal does NOT extend checkpoint {} (row {})", from.display(), old.size));
    }
    if !problems.is_empty() {
        eprintln!("the journal's history up to row {} was rewritten (a witness refuses this proof):", old.size);
        for p in &problems {
            eprintln!("  - {}", postern_core::Outside::line(p));
        }
        return Ok(ExitCode::from(1));
    }
    eprintln!("the journal at row {} extends checkpoint {} (row {})", new.size, from.display(), old.size);
    Ok(ExitCode::SUCCESS)
}

/// `audit prove --row SEQ`: the row, its leaf hash and its audit path in the tree of `size` rows
/// (default: the journal as it is), or of the tree a signed checkpoint note committed to
/// (`checkpoint`: its size, and its root must be the one the proof leads to).
pub fn prove_row(
    data_dir: &Path,
    seq: u64,
    size: Option<u64>,
    checkpoint: Option<&Path>,
    pubkey: Option<&str>,
    json: bool,
) -> Result<ExitCode, Failure> {
    let db = location::database(data_dir);
    let against = match checkpoint {
        Some(path) => {
            let exported = Exported::read(path)?;
            let Exported::Note { origin, tree, .. } = &exported else {
                return Err(Failure {
                    code: 2,
                    error: anyhow!("checkpoint {} is in the JSON format: it holds no Merkle tree root", path.display()),
                });
            };
            same_installation(&db, origin, path)?;
            if matches!(check_signature(&exported, path, pubkey)?, Signature::NotChecked) {
                eprintln!("note: the checkpoint's signature was not checked (no --pubkey)");
            }
            Some(*tree)
        }
        None => None,
    };
    let reader = TreeReader::open(&db)?;
    let size = against.map(|t| t.size).or(size).unwrap_or(reader.size);
    if seq == 0 || seq > size {
        return Err(Failure {
            code: 2,
            error: anyhow!("row {seq} is not among the {size} rows of the tree asked for"),
        });
    }
    let proof = reader.inclusion(seq, size).map_err(tampered)?;
    let root = against.map_or(proof.tree.root, |t| t.root);
    let leaf = merkle::leaf_hash(proof.body.as_bytes());
    let holds = merkle::verify_inclusion(&leaf, seq - 1, size, &proof.proof, &root);
    if json {
        render::print_json(&serde_json::json!({
            "seq": seq, "leaf_index": seq - 1, "tree_size": size, "root": b64(&root),
            "leaf_hash": b64(&leaf), "proof": proof.proof.iter().map(b64).collect::<Vec<_>>(), "body": proof.body,
            "holds": holds, "against_checkpoint": against.is_some(),
        }))?;
    } else {
        println!("row         {seq} (leaf index {})", seq - 1);
        println!("tree        {size} rows, root {}", b64(&root));
        println!("leaf hash   {} = SHA-256(0x00 || the row's body)", b64(&leaf));
        for (i, hash) in proof.proof.iter().enumerate() {
            println!("{}{}", if i == 0 { "proof       " } else { "            " }, b64(hash));
        }
        println!("body        {}", postern_core::Outside::line(&proof.body));
    }
    if !holds {
        eprintln!(
            "row {seq} does NOT prove into the tree of {size} rows{}: it was changed after the tree was made",
            if against.is_some() { " the checkpoint committed to" } else { "" }
        );
        return Ok(ExitCode::from(1));
    }
    if against.is_none() {
        eprintln!(
            "note: proved against the journal's own tree; give --checkpoint NOTE to prove against one kept elsewhere"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `audit rederive`: the authority tables rebuilt from a verified journal; says what changed.
pub fn rederive(data_dir: &Path) -> Result<ExitCode, Failure> {
    let changed = match Store::rederive_authority(&location::database(data_dir), now()) {
        Err(postern_store::StoreError::InUse { .. }) => {
            return Err(Failure {
                code: 1,
                error: anyhow::anyhow!(
                    "`audit rederive` rebuilds the tables every decision is read from, so it needs the journal to \
                     itself: stop the running gateway (or quit the desktop app), run it, and start the gateway again"
                ),
            });
        }
        other => other?,
    };
    if changed.is_empty() {
        println!("the authority tables already match the journal; nothing changed");
    } else {
        for c in &changed {
            println!("rebuilt: {c}");
        }
        println!("{} row(s) rebuilt from the journal (journaled as authority_rederived)", changed.len());
    }
    Ok(ExitCode::SUCCESS)
}

/// `audit pubkey`: the journal-signing key's public half (asked of the gateway when one runs),
/// in hex or, with `vkey`, as the note verifier key a witness is configured with.
pub fn pubkey(data_dir: &Path, vkey: bool) -> Result<ExitCode, Failure> {
    let answer = crate::route::perform(data_dir, postern_gateway::door::control::ControlRequest::PublicKey)?;
    println!("{}", answer[if vkey { "vkey" } else { "hex" }].as_str().unwrap_or_default());
    Ok(ExitCode::SUCCESS)
}
