// Hugging Face `tokenizer.json` files of BPE, encoded and decoded as the `tokenizers` library
// does: byte-level (GPT-2's scheme, used by Llama 3 and SmolLM), and SentencePiece-style with
// byte fallback (Llama 2's, Mistral's).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "data/tokenizer.h"

namespace tessera::data {

// Whether `bytes` hold a tokenizer.json (a JSON object) rather than a SentencePiece model (a
// protocol buffer, whose first byte is a field tag, never '{').
bool is_hf_tokenizer(std::string_view bytes);

// The tokenizer `bytes` describe (the contents of `path`, named in errors). Implemented:
// - byte-level: the pre-tokenizers Split (a regex or string, Isolated or Removed), Digits and
//   ByteLevel, alone or in a Sequence; the ByteLevel decoder;
// - SentencePiece-style: the normalizers Prepend and Replace (of a string); no pre-tokenizer, or
//   Metaspace (split false), or the above but ByteLevel; BPE over characters with byte_fallback
//   ("<0xXX>" tokens), unk_token and fuse_unk; the decoders Replace, ByteFallback, Fuse, Strip
//   and Metaspace;
// - both: the BPE merges (either spelling) and `ignore_merges`; added tokens, matched in the text
//   before anything else as `tokenizers` does.
// Anything else throws DataError naming the key, as does a malformed file.
//
// Encoding adds no special tokens; `document_start()` gives the BOS that the file's
// TemplateProcessing post-processor puts before each text. The EOS is the first added token of
// <|end_of_text|>, <|endoftext|>, </s> (the names Llama 3, GPT-2 and SmolLM, and Llama 2 use),
// the BOS the template's, else the first of <|begin_of_text|>, <s>, <|startoftext|>.
// Generation stops at the EOS and at the ends of a chat turn the file has: <|eot_id|> and
// <|eom_id|> (Llama 3), <|im_end|> (ChatML).
// Text that is not UTF-8 is read with each bad sequence as U+FFFD; decoding does the same to
// the bytes it produces, as `tokenizers` does.
std::unique_ptr<TokenizerModel> load_hf_tokenizer(const std::string& bytes, const std::string& path);

}  // namespace tessera::data
