//! SentencePiece-style ("llama" in GGUF) tokenization: start from single characters and
//! repeatedly join the adjacent pair whose concatenation is the vocabulary entry with the
//! highest score (ties: leftmost pair first). Characters that end up outside the vocabulary are
//! emitted as their UTF-8 bytes through the `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// One candidate join of the symbols at `left` and `right`, whose text spans `len` bytes.
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    /// Max-heap order: higher score first, then the smaller left index.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// A live symbol: the byte range `start..start + len` of the text, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// The vocabulary view the SPM algorithm needs.
pub struct Spm<'a> {
    pub lookup: &'a HashMap<String, u32>,
    pub scores: &'a [f32],
    /// Id of `<0xXX>` for each byte, where present.
    pub byte_ids: &'a [Option<u32>; 256],
    pub unk: Option<u32>,
}

impl Spm<'_> {
    /// Tokenizes `text` (already whitespace-escaped) and appends the ids to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut syms: Vec<Symbol> = Vec::new();
        for (i, (start, ch)) in text.char_indices().enumerate() {
            syms.push(Symbol {
                start,
                len: ch.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                syms[i - 1].next = Some(i);
            }
        }
        if syms.is_empty() {
            return;
        }
        let mut heap = BinaryHeap::new();
        for i in 1..syms.len() {
            self.push_candidate(text, &syms, i - 1, i, &mut heap);
        }
        while let Some(c) = heap.pop() {
            let (l, r) = (syms[c.left], syms[c.right]);
            // Stale: one side was already joined into something else.
            if l.len == 0 || r.len == 0 || l.len + r.len != c.len {
                continue;
            }
            syms[c.left].len += r.len;
            syms[c.left].next = r.next;
            syms[c.right].len = 0;
            if let Some(n) = r.next {
                syms[n].prev = Some(c.left);
            }
            if let Some(p) = syms[c.left].prev {
                self.push_candidate(text, &syms, p, c.left, &mut heap);
            }
            if let Some(n) = syms[c.left].next {
                self.push_candidate(text, &syms, c.left, n, &mut heap);
            }
        }
        let mut cur = Some(0);
        while let Some(i) = cur {
            let s = syms[i];
            let piece = &text[s.start..s.start + s.len];
            match self.lookup.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        if let Some(id) = self.byte_ids[b as usize].or(self.unk) {
                            out.push(id);
                        }
                    }
                }
            }
            cur = s.next;
        }
    }

    fn push_candidate(
        &self,
        text: &str,
        syms: &[Symbol],
        left: usize,
        right: usize,
        heap: &mut BinaryHeap<Candidate>,
    ) {
        let (l, r) = (syms[left], syms[right]);
        let len = l.len + r.len;
        let joined = &text[l.start..l.start + len];
        if let Some(&id) = self.lookup.get(joined) {
            let score = self.scores.get(id as usize).copied().unwrap_or(0.0);
            heap.push(Candidate {
                score,
                left,
                right,
                len,
            });
        }
    }
}
