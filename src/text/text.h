// text/text.h — everything between a string and token ids: the tokenizer and the chat templates.
//
// Owns: UTF-8 repair and NFC (utf8.h), the Split pre-tokenizer regex (pretokenizer.h), added-token
// matching (added_tokens.h), byte-level BPE with its cache (bpe.h), the Tokenizer read from a HF
// tokenizer.json (tokenizer.h), and chat templates with trainable segments (chat_template.h).
// Depends on io/ (JSON files), PCRE2 and utf8proc; nothing in it knows about models or tensors, so the
// data pipeline (train/) builds on it and model/ does not need it.
#pragma once

#include "text/chat_template.h"
#include "text/tokenizer.h"
