//! The journal's Merkle tree (RFC 6962 §2.1): its hashes, the right edge kept while rows are
//! appended ([`Frontier`]), tree heads, and the two proofs a witness or an investigator checks —
//! that a row is in the tree ([`inclusion_proof`]) and that a later tree extends an earlier one
//! ([`consistency_proof`]) — with their verification (RFC 9162 §2.1.3.2 and §2.1.4.2).
//!
//! Pure: the hashes of complete subtrees come from a [`Subtrees`] source the caller supplies (the
//! store reads them from its rows and its kept nodes).

use sha2::{Digest, Sha256};

/// A SHA-256 tree hash.
pub type Hash = [u8; 32];

/// The hash of one leaf: `SHA-256(0x00 || data)`.
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0x00]);
    h.update(data);
    h.finalize().into()
}

/// The hash of an interior node: `SHA-256(0x01 || left || right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([0x01]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root of the empty tree: the hash of the empty string.
pub fn empty_root() -> Hash {
    Sha256::digest(b"").into()
}

/// A tree head: the tree's size and its root hash (what a checkpoint signs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeHead {
    pub size: u64,
    pub root: Hash,
}

/// A complete subtree: the `2^level` leaves from leaf `index << level` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Subtree {
    pub level: u32,
    pub index: u64,
}

impl Subtree {
    /// The first leaf it covers.
    pub fn start(self) -> u64 {
        self.index << self.level
    }
}

/// Where the hashes of complete subtrees come from.
pub trait Subtrees {
    type Error;
    fn hash(&mut self, subtree: Subtree) -> Result<Hash, Self::Error>;
}

/// The largest power of two strictly less than `n` (`n >= 2`).
fn split(n: u64) -> u64 {
    debug_assert!(n >= 2);
    1 << (63 - (n - 1).leading_zeros())
}

/// MTH(D[start:end]) for a range the RFC's recursion reaches (its start aligned to the largest
/// power of two below its size), from complete subtrees.
fn range_hash<S: Subtrees>(start: u64, end: u64, src: &mut S) -> Result<Hash, S::Error> {
    let size = end - start;
    if size.is_power_of_two() && start.is_multiple_of(size) {
        let level = size.trailing_zeros();
        return src.hash(Subtree { level, index: start >> level });
    }
    let k = split(size);
    let left = range_hash(start, start + k, src)?;
    let right = range_hash(start + k, end, src)?;
    Ok(node_hash(&left, &right))
}

/// The tree head at `size` leaves.
pub fn root<S: Subtrees>(size: u64, src: &mut S) -> Result<Hash, S::Error> {
    if size == 0 { Ok(empty_root()) } else { range_hash(0, size, src) }
}

/// The audit path of leaf `index` in the tree of `size` leaves (RFC 6962 §2.1.1), leaf side
/// first. `None` when the leaf is not in the tree.
pub fn inclusion_proof<S: Subtrees>(index: u64, size: u64, src: &mut S) -> Result<Option<Vec<Hash>>, S::Error> {
    fn path<S: Subtrees>(m: u64, start: u64, end: u64, src: &mut S, out: &mut Vec<Hash>) -> Result<(), S::Error> {
        let n = end - start;
        if n == 1 {
            return Ok(());
        }
        let k = split(n);
        if m < k {
            path(m, start, start + k, src, out)?;
            out.push(range_hash(start + k, end, src)?);
        } else {
            path(m - k, start + k, end, src, out)?;
            out.push(range_hash(start, start + k, src)?);
        }
        Ok(())
    }
    if index >= size {
        return Ok(None);
    }
    let mut out = Vec::new();
    path(index, 0, size, src, &mut out)?;
    Ok(Some(out))
}

/// The proof that the tree of `new` leaves extends the tree of `old` leaves (RFC 6962 §2.1.2):
/// empty when `old` is 0 or equals `new`. `None` when `old > new`.
pub fn consistency_proof<S: Subtrees>(old: u64, new: u64, src: &mut S) -> Result<Option<Vec<Hash>>, S::Error> {
    fn subproof<S: Subtrees>(
        m: u64,
        start: u64,
        end: u64,
        whole: bool,
        src: &mut S,
        out: &mut Vec<Hash>,
    ) -> Result<(), S::Error> {
        let n = end - start;
        if m == n {
            if !whole {
                out.push(range_hash(start, end, src)?);
            }
            return Ok(());
        }
        let k = split(n);
        if m <= k {
            subproof(m, start, start + k, whole, src, out)?;
            out.push(range_hash(start + k, end, src)?);
        } else {
            subproof(m - k, start + k, end, false, src, out)?;
            out.push(range_hash(start, start + k, src)?);
        }
        Ok(())
    }
    if old > new {
        return Ok(None);
    }
    let mut out = Vec::new();
    if old > 0 && old < new {
        subproof(old, 0, new, true, src, &mut out)?;
    }
    Ok(Some(out))
}

/// Checks an audit path (RFC 9162 §2.1.3.2).
pub fn verify_inclusion(leaf: &Hash, index: u64, size: u64, proof: &[Hash], root: &Hash) -> bool {
    if index >= size {
        return false;
    }
    let (mut f, mut s) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if s == 0 {
            return false;
        }
        if f & 1 == 1 || f == s {
            r = node_hash(p, &r);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    s == 0 && r == *root
}

/// Checks a consistency proof between the tree heads `(old, old_root)` and `(new, new_root)`
/// (RFC 9162 §2.1.4.2).
pub fn verify_consistency(old: u64, new: u64, old_root: &Hash, new_root: &Hash, proof: &[Hash]) -> bool {
    if old > new {
        return false;
    }
    if old == new {
        return proof.is_empty() && old_root == new_root;
    }
    if old == 0 {
        return proof.is_empty() && *old_root == empty_root();
    }
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if old.is_power_of_two() {
        path.push(*old_root);
    }
    path.extend_from_slice(proof);
    let Some((first, rest)) = path.split_first() else { return false };
    let (mut f, mut s) = (old - 1, new - 1);
    while f & 1 == 1 {
        f >>= 1;
        s >>= 1;
    }
    let (mut fr, mut sr) = (*first, *first);
    for c in rest {
        if s == 0 {
            return false;
        }
        if f & 1 == 1 || f == s {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        f >>= 1;
        s >>= 1;
    }
    fr == *old_root && sr == *new_root && s == 0
}

/// The right edge of a tree as rows are appended: the roots of the complete subtrees its size
/// is made of (one per set bit, largest first). Enough to give the tree head and to name every
/// subtree an append completes, without reading anything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    roots: Vec<Hash>,
}

impl Frontier {
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The complete subtrees a tree of `size` leaves is made of, largest first.
    pub fn parts(size: u64) -> Vec<Subtree> {
        let mut parts = Vec::new();
        let mut start = 0;
        for level in (0..64).rev() {
            if size & (1 << level) != 0 {
                parts.push(Subtree { level, index: start >> level });
                start += 1 << level;
            }
        }
        parts
    }

    /// The right edge of the tree of `size` leaves, read from `src`.
    pub fn at<S: Subtrees>(size: u64, src: &mut S) -> Result<Frontier, S::Error> {
        let roots = Frontier::parts(size).into_iter().map(|p| src.hash(p)).collect::<Result<_, _>>()?;
        Ok(Frontier { size, roots })
    }

    /// Appends a leaf; returns every subtree the append completed, the leaf's own first.
    pub fn push(&mut self, leaf: Hash) -> Vec<(Subtree, Hash)> {
        let mut index = self.size;
        let mut level = 0;
        let mut hash = leaf;
        let mut completed = vec![(Subtree { level, index }, hash)];
        while index & 1 == 1 {
            let Some(left) = self.roots.pop() else { break };
            hash = node_hash(&left, &hash);
            index >>= 1;
            level += 1;
            completed.push((Subtree { level, index }, hash));
        }
        self.roots.push(hash);
        self.size += 1;
        completed
    }

    /// The tree head.
    pub fn head(&self) -> TreeHead {
        TreeHead { size: self.size, root: self.root() }
    }

    /// The tree head's root hash.
    pub fn root(&self) -> Hash {
        let mut parts = self.roots.iter().rev();
        let Some(last) = parts.next() else { return empty_root() };
        parts.fold(*last, |right, left| node_hash(left, &right))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Subtrees computed from leaves in memory.
    struct Leaves(Vec<Hash>);

    impl Subtrees for Leaves {
        type Error = std::convert::Infallible;
        fn hash(&mut self, s: Subtree) -> Result<Hash, Self::Error> {
            let start = usize::try_from(s.start()).unwrap();
            let mut level: Vec<Hash> = self.0[start..start + (1 << s.level)].to_vec();
            while level.len() > 1 {
                level = level.chunks(2).map(|p| node_hash(&p[0], &p[1])).collect();
            }
            Ok(level[0])
        }
    }

    fn leaves(n: u64) -> Leaves {
        Leaves((0..n).map(|i| leaf_hash(format!("row {i}").as_bytes())).collect())
    }

    /// MTH straight from the RFC's definition.
    fn mth(d: &[Hash]) -> Hash {
        match d.len() {
            0 => empty_root(),
            1 => d[0],
            n => {
                let k = usize::try_from(split(n as u64)).unwrap();
                node_hash(&mth(&d[..k]), &mth(&d[k..]))
            }
        }
    }

    #[test]
    fn known_answers() {
        // The empty tree, and a one-leaf tree of the empty leaf (RFC 6962 test vectors as
        // carried by Certificate Transparency's implementations).
        assert_eq!(hex::encode(empty_root()), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex::encode(leaf_hash(b"")), "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d");
    }

    proptest! {
        #[test]
        fn the_frontier_the_source_and_the_definition_agree(n in 0u64..300) {
            let mut src = leaves(n);
            let mut frontier = Frontier::default();
            for (i, leaf) in src.0.clone().iter().enumerate() {
                let completed = frontier.push(*leaf);
                for (subtree, hash) in completed {
                    prop_assert_eq!(src.hash(subtree).unwrap(), hash, "leaf {}", i);
                }
            }
            prop_assert_eq!(frontier.root(), mth(&src.0));
            prop_assert_eq!(root(n, &mut src).unwrap(), mth(&src.0));
            prop_assert_eq!(Frontier::at(n, &mut src).unwrap(), frontier);
        }

        #[test]
        fn every_proof_verifies_and_a_changed_one_does_not(n in 1u64..130, a in 0u64..130, b in 0u64..130) {
            let mut src = leaves(n);
            let index = a % n;
            let head = root(n, &mut src).unwrap();
            let path = inclusion_proof(index, n, &mut src).unwrap().unwrap();
            prop_assert!(verify_inclusion(&src.0[usize::try_from(index).unwrap()], index, n, &path, &head));
            prop_assert!(!verify_inclusion(&leaf_hash(b"another row"), index, n, &path, &head));
            let old = b % (n + 1);
            let old_root = root(old, &mut src).unwrap();
            let proof = consistency_proof(old, n, &mut src).unwrap().unwrap();
            prop_assert!(verify_consistency(old, n, &old_root, &head, &proof));
            if 0 < old && old < n {
                // A rewritten history (another leaf among the old ones) has another old root.
                let mut other = src.0.clone();
                other[0] = leaf_hash(b"rewritten");
                prop_assert!(!verify_consistency(old, n, &mth(&other[..usize::try_from(old).unwrap()]), &head, &proof));
                let mut bent = proof.clone();
                bent[0][0] ^= 1;
                prop_assert!(!verify_consistency(old, n, &old_root, &head, &bent));
            }
        }
    }

    #[test]
    fn proofs_outside_the_tree_are_refused() {
        let mut src = leaves(5);
        assert_eq!(inclusion_proof(5, 5, &mut src).unwrap(), None);
        assert_eq!(consistency_proof(6, 5, &mut src).unwrap(), None);
        assert!(!verify_inclusion(&src.0[0], 5, 5, &[], &empty_root()));
    }
}
