//! Incremental detokenization: token ids in, complete UTF-8 text out.

use super::{TokenType, Tokenizer};

/// Turns a stream of token ids into text, one id at a time. A character whose UTF-8 bytes are
/// spread over several tokens (byte-level BPE pieces of emoji or CJK, `<0xXX>` byte tokens) is
/// held back until its last byte arrives; byte sequences that can never become valid UTF-8 are
/// emitted as U+FFFD.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    pending: Vec<u8>,
    /// No normal token has been decoded yet (SentencePiece drops the first token's leading space).
    at_start: bool,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer) -> Self {
        Self {
            tok,
            pending: Vec::new(),
            at_start: true,
        }
    }

    /// Adds one token; returns the text that became complete (often empty while a multi-byte
    /// character is being assembled).
    pub fn push(&mut self, id: u32) -> String {
        let mut bytes = self.tok.token_bytes(id);
        let ty = self.tok.token_type(id);
        if self.at_start && matches!(ty, Some(TokenType::Normal | TokenType::Byte)) {
            self.at_start = false;
            if self.tok.strips_leading_space() && bytes.first() == Some(&b' ') {
                bytes.remove(0);
            }
        }
        self.pending.extend_from_slice(&bytes);
        self.take_complete()
    }

    /// Flushes whatever is still held back (an unfinished character becomes U+FFFD) and makes
    /// the decoder ready for a new sequence.
    pub fn finish(&mut self) -> String {
        let mut out = self.take_complete();
        if !self.pending.is_empty() {
            out.push_str(&String::from_utf8_lossy(&self.pending));
            self.pending.clear();
        }
        self.at_start = true;
        out
    }

    /// Bytes received but not yet returned (an incomplete character).
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut pos = 0;
        loop {
            match std::str::from_utf8(&self.pending[pos..]) {
                Ok(s) => {
                    out.push_str(s);
                    pos = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Safe: from_utf8 vouched for these bytes.
                    out.push_str(
                        std::str::from_utf8(&self.pending[pos..pos + valid]).unwrap_or(""),
                    );
                    pos += valid;
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            pos += bad;
                        }
                        None => break, // incomplete character at the end: wait for more
                    }
                }
            }
        }
        self.pending.drain(..pos);
        out
    }
}
