// train/data.h — the data pipeline: dataset files -> conversations -> token ids and trainable flags
// (cached) -> shuffled, padded or packed batches with a resumable cursor.
//
// Owns: dataset formats and the dataset_info.json registry (data_format.h); tokenising with the
// cutoff and bad-record policies, the report, and the on-disk cache (data_tokenize.h, data_cache.h);
// the loader with shuffling, epochs, padding, packing and the cursor (data_loader.h). Builds on text/
// (tokenizer, chat templates) and hands model/'s Batch to the step. docs/data.md describes it.
//
//   auto specs = lt::resolve_datasets(lt::split_dataset_list("alpaca_en,data/gsm8k.jsonl"), "data");
//   lt::TokenizedDataset data = lt::load_datasets(specs, tok, tpl, {.cutoff_len = 2048,
//                                                 .cache_dir = output_dir + "/data_cache"});
//   log(data.summary());
//   lt::DataLoader loader(data, {.batch_size = 4, .seed = 42, .packing = lt::Packing::on,
//                                .row_len = 2048, .pad_id = lt::default_pad_id(tok)});
//   loader.seek(saved_cursor);                 // when resuming
//   lt::Batch batch = loader.next();
//   lt::Cursor cursor = loader.cursor();       // saved with the checkpoint
#pragma once

#include "train/data_format.h"
#include "train/data_loader.h"
#include "train/data_tokenize.h"
