//! Streamed replies of `rredcot serve` (`"stream": true`): each choice's text as it decodes, as
//! OpenAI's chunks, so that the deltas of a choice put together are exactly the text a
//! non-streamed request with the same seed gets.
//!
//! The text is detokenized incrementally, as vLLM does: a window of the newest tokens is decoded
//! against the same window without its new tokens, so each read-back costs a few tokens' decode
//! however long the choice is, and text waits while it ends in an incomplete UTF-8 sequence
//! (U+FFFD). The last characters that could still become a stop string are held back until the
//! choice ends; then the rest of its final text (cut before its stop string) goes out.

use serde_json::{json, Value};

use crate::model::{Result, Tokenizer};

/// What a streamed request asked for beside the stream (`stream_options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOptions {
    /// `include_usage`: a last chunk with the token counts (and `"usage": null` in the others).
    pub include_usage: bool,
}

/// One choice's text as it streams out.
#[derive(Debug)]
pub struct TextStream {
    /// Special tokens are left out of the text (the request's `skip_special_tokens`).
    skip_special: bool,
    /// The text decoded so far, and how many of its bytes were sent.
    decoded: String,
    sent: usize,
    /// The decode window: tokens before `read` were decoded into `decoded`; decoding starts at
    /// `prefix` so that a token's text is read in its context (leading spaces, merged bytes).
    prefix: usize,
    read: usize,
}

impl TextStream {
    /// A choice's stream, its text with or without special tokens.
    pub fn new(skip_special: bool) -> Self {
        TextStream { skip_special, decoded: String::new(), sent: 0, prefix: 0, read: 0 }
    }

    /// The text to send now, given every token of the choice so far: what is new since the last
    /// call, except the last `hold` characters (a stop string of `hold + 1` characters could
    /// start there) and anything from a stop string on.
    pub fn advance(&mut self, tok: &Tokenizer, tokens: &[i64], hold: usize, stops: &[String]) -> Result<Option<String>> {
        if tokens.len() > self.read {
            let before = tok.decode(&tokens[self.prefix..self.read], self.skip_special)?;
            let now = tok.decode(&tokens[self.prefix..], self.skip_special)?;
            // Complete characters only; a window whose text did not grow waits for more tokens.
            if now.len() > before.len() && !now.ends_with('\u{FFFD}') && now.is_char_boundary(before.len()) && now.starts_with(&before) {
                self.decoded.push_str(&now[before.len()..]);
                self.prefix = self.read;
                self.read = tokens.len();
            }
        }
        // Where the last `hold` characters start.
        let mut end = match hold {
            0 => self.decoded.len(),
            h => self.decoded.char_indices().rev().nth(h - 1).map_or(0, |(i, _)| i),
        };
        // A stop string that starts a stop's length or more before what was sent ends inside the
        // sent text, and was looked for when that was sent: look from there on only, so that a
        // long choice is not searched whole at every read-back.
        let mut from = self.sent.saturating_sub(stops.iter().map(String::len).max().unwrap_or(0));
        while !self.decoded.is_char_boundary(from) {
            from -= 1;
        }
        if let Some(cut) = stops.iter().filter_map(|s| self.decoded[from..].find(s.as_str())).min() {
            end = end.min(from + cut);
        }
        Ok(self.take(end))
    }

    /// The rest of the choice's `final_text` (its whole text, cut at a stop string) not sent
    /// yet. If what was sent is not where `final_text` starts (a tokenizer whose decode of a
    /// prefix is not a prefix of its decode of the whole), the text from where they part is sent
    /// and a warning logged: sent text cannot be taken back.
    pub fn finish(&mut self, final_text: &str) -> Option<String> {
        let sent = &self.decoded[..self.sent];
        let from = if final_text.starts_with(sent) {
            sent.len()
        } else {
            let common = sent.char_indices().zip(final_text.chars()).take_while(|((_, a), b)| a == b).last().map_or(0, |((i, c), _)| i + c.len_utf8());
            tracing::warn!("a streamed choice sent {:?} where its text is {:?}: streaming from character {common} on", sent, final_text);
            common
        };
        self.decoded = final_text.to_string();
        self.sent = from;
        self.take(final_text.len())
    }

    /// Marks `decoded[sent..end]` sent and returns it (none when empty).
    fn take(&mut self, end: usize) -> Option<String> {
        (end > self.sent).then(|| {
            let out = self.decoded[self.sent..end].to_string();
            self.sent = end;
            out
        })
    }
}

/// Builds a streamed reply's chunks: every one carries the reply's id, object, creation time and
/// model, as OpenAI's do.
pub struct Chunks {
    pub id: String,
    pub created: u64,
    pub model: String,
    /// A chat reply (`chat.completion.chunk` with `delta`s) or a completion (`text_completion`).
    pub chat: bool,
    pub include_usage: bool,
}

impl Chunks {
    fn chunk(&self, choices: Vec<Value>) -> Value {
        let object = if self.chat { "chat.completion.chunk" } else { "text_completion" };
        let mut c = json!({ "id": self.id, "object": object, "created": self.created, "model": self.model, "choices": choices });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    /// Choice `index`'s first chunk of a chat reply: its role.
    pub fn role(&self, index: usize) -> Value {
        self.chunk(vec![json!({ "index": index, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null })])
    }

    /// Choice `index`'s next piece of text.
    pub fn text(&self, index: usize, text: &str) -> Value {
        self.chunk(vec![self.choice(index, Some(text), None)])
    }

    /// Choice `index`'s last chunk: the rest of its text (if any), why it ended, and the whole
    /// choice's `logprobs` and (a completion's) `token_ids` when they were asked for.
    pub fn end(&self, index: usize, text: Option<&str>, finish_reason: &str, logprobs: Option<Value>, token_ids: Option<&[i64]>) -> Value {
        let mut c = self.choice(index, text, Some(finish_reason));
        if let Some(l) = logprobs {
            c["logprobs"] = l;
        }
        if let Some(ids) = token_ids {
            c["token_ids"] = json!(ids);
        }
        self.chunk(vec![c])
    }

    fn choice(&self, index: usize, text: Option<&str>, finish_reason: Option<&str>) -> Value {
        if self.chat {
            let delta = text.map_or_else(|| json!({}), |t| json!({ "content": t }));
            json!({ "index": index, "delta": delta, "logprobs": null, "finish_reason": finish_reason })
        } else {
            json!({ "index": index, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish_reason })
        }
    }

    /// The last chunk when usage was asked for: no choices, the token counts.
    pub fn usage(&self, prompt_tokens: usize, completion_tokens: usize) -> Value {
        let mut c = self.chunk(vec![]);
        c["usage"] = json!({ "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens });
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level BPE trained on a few lines, so that accented letters, arrows and emoji are
    /// split into byte tokens whose prefixes decode to U+FFFD.
    fn tokenizer() -> Tokenizer {
        let texts: Vec<String> = (0..40).map(|i| format!("Step {i}: add {i} + 3 = {}.\n\nThe answer is {}.", i + 3, i + 3)).collect();
        Tokenizer::trained_on(&texts)
    }

    /// Streams `text`'s tokens `every` at a time as the decode loop would: the row ends at the
    /// first read-back whose tail holds a stop string. Returns the pieces sent before the end, the
    /// last piece and the final text.
    fn stream(tok: &Tokenizer, text: &str, every: usize, stops: &[String]) -> (Vec<String>, Option<String>, String) {
        let ids = tok.encode(text).unwrap();
        let hold = stops.iter().map(|s| s.chars().count()).max().unwrap_or(0).saturating_sub(1);
        let mut s = TextStream::new(true);
        let mut pieces = Vec::new();
        let mut upto = 0;
        while upto < ids.len() {
            upto = (upto + every).min(ids.len());
            let so_far = &ids[..upto];
            if stops.iter().any(|st| tok.decode(so_far, false).unwrap().contains(st.as_str())) {
                break;
            }
            if upto == ids.len() {
                break;
            }
            pieces.extend(s.advance(tok, so_far, hold, stops).unwrap());
            // What was sent is always where the text so far starts, cut before a stop string.
            let sent: String = pieces.concat();
            assert!(tok.decode(so_far, true).unwrap().starts_with(&sent), "{text:?} every {every}: sent {sent:?}");
        }
        let mut last = tok.decode(&ids[..upto], true).unwrap();
        if let Some(cut) = stops.iter().filter_map(|st| last.find(st.as_str())).min() {
            last.truncate(cut);
        }
        (pieces, s.finish(&last), last)
    }

    #[test]
    fn streamed_pieces_make_up_the_final_text_and_never_split_a_character_or_a_stop_string() {
        let tok = tokenizer();
        let texts = [
            "Step 4: add 4 + 3 = 7.\n\nThe answer is 7.",
            "Café → crème brûlée 🍰🍰 costs 7 €, naïve Σ ≤ ∞.",
            "The answer is 12<|im_end|> and more text after a special token.",
            "plain words without any stop",
        ];
        let stops: [&[String]; 3] = [&[], &["\n\n".to_string()], &["answer".to_string(), "🍰".to_string()]];
        for text in texts {
            for stop in stops {
                for every in [1, 2, 3, 7, 64] {
                    let (pieces, last, final_text) = stream(&tok, text, every, stop);
                    assert!(pieces.iter().all(|p| !p.is_empty() && !p.contains('\u{FFFD}')), "{text:?}/{stop:?}/{every}: {pieces:?}");
                    let whole: String = pieces.iter().cloned().chain(last).collect();
                    assert_eq!(whole, final_text, "{text:?}, stops {stop:?}, every {every}: {pieces:?}");
                    assert!(stop.iter().all(|st| !whole.contains(st.as_str())));
                }
            }
        }
        // Text streams as it comes: one token at a time, the pieces before the end are most of it.
        let (pieces, _, final_text) = stream(&tok, texts[1], 1, &[]);
        assert!(pieces.len() > 10 && pieces.concat().len() + 8 >= final_text.len(), "{pieces:?}");
    }

    #[test]
    fn a_tail_that_could_become_a_stop_string_waits() {
        let tok = tokenizer();
        let ids = tok.encode("The answer is 7.\n").unwrap();
        let mut s = TextStream::new(true);
        let sent = s.advance(&tok, &ids, 1, &["\n\n".to_string()]).unwrap().unwrap();
        assert_eq!(sent, "The answer is 7.", "the newline may start \\n\\n");
        assert_eq!(s.advance(&tok, &ids, 1, &["\n\n".to_string()]).unwrap(), None, "nothing new");
        assert_eq!(s.finish("The answer is 7.\n").as_deref(), Some("\n"));
        // A final text that parts from what was sent (a decode that is not prefix-stable) is sent
        // from where they part.
        let mut s = TextStream::new(true);
        s.advance(&tok, &tok.encode("add 4").unwrap(), 0, &[]).unwrap();
        assert_eq!(s.finish("add 5 + 1").as_deref(), Some("5 + 1"));
    }

    #[test]
    fn chunks_have_openai_shapes() {
        let chat = Chunks { id: "chatcmpl-1".into(), created: 9, model: "m".into(), chat: true, include_usage: true };
        assert_eq!(
            chat.role(1),
            json!({ "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 9, "model": "m", "usage": null,
                    "choices": [{ "index": 1, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null }] })
        );
        assert_eq!(chat.text(0, "hi")["choices"][0]["delta"], json!({ "content": "hi" }));
        let end = chat.end(0, None, "stop", None, None);
        assert_eq!((end["choices"][0]["delta"].clone(), end["choices"][0]["finish_reason"].clone()), (json!({}), json!("stop")));
        let logprobs = json!({ "content": [{ "token": "a", "logprob": -0.5, "bytes": null, "top_logprobs": [] }], "refusal": null });
        assert_eq!(chat.end(0, Some("a"), "stop", Some(logprobs.clone()), None)["choices"][0]["logprobs"], logprobs);
        let usage = chat.usage(3, 4);
        assert_eq!((usage["choices"].clone(), usage["usage"]["total_tokens"].clone()), (json!([]), json!(7)));
        let comp = Chunks { id: "cmpl-1".into(), created: 9, model: "m".into(), chat: false, include_usage: false };
        let end = comp.end(2, Some("x"), "length", None, None);
        assert_eq!(end["object"], "text_completion");
        assert_eq!(end["choices"][0], json!({ "index": 2, "text": "x", "logprobs": null, "finish_reason": "length" }));
        let logprobs = json!({ "tokens": ["x"], "token_logprobs": [-0.1], "top_logprobs": [{ "x": -0.1 }], "text_offset": [0] });
        assert_eq!(
            comp.end(2, Some("x"), "length", Some(logprobs.clone()), Some(&[7]))["choices"][0],
            json!({ "index": 2, "text": "x", "logprobs": logprobs, "finish_reason": "length", "token_ids": [7] })
        );
        assert!(end.get("usage").is_none(), "no usage key unless asked for");
    }
}
