// train/trainer.cpp — `lazytrain train`: the settings resolved, a training session set up, then the loop — when to
// save, evaluate and stop — and the summary.
#include "train/trainer.h"

#include <fmt/format.h>

#include "core/timer.h"
#include "dist/comm.h"
#include "exec/backend.h"
#include "io/json_file.h"
#include "train/session.h"
#include "train/settings.h"
#include "train/stop_signal.h"

namespace lt {

ChatTemplateKind train_template_kind(const TrainConfig& c, ModelType type) {
  return c.template_name == "auto" ? default_chat_template(model_type_name(type))
                                   : parse_chat_template_kind(c.template_name);
}

DataLoader load_train_data(const TrainConfig& c, const Tokenizer& tok, const ChatTemplate& tpl) {
  TokenizeOptions topt;
  topt.cutoff_len = c.cutoff_len;
  topt.on_bad_example = parse_on_bad_example(c.on_bad_example);
  topt.cache_dir = c.output_dir + "/data_cache";
  TokenizedDataset data = load_datasets(resolve_datasets(c.dataset, c.dataset_dir), tok, tpl, topt);
  LoaderOptions lopt;
  lopt.batch_size = c.per_device_train_batch_size;
  lopt.seed = uint64_t(c.seed);
  lopt.packing = c.packing ? Packing::on : Packing::off;
  lopt.row_len = c.cutoff_len;
  lopt.pad_id = default_pad_id(tok);
  return DataLoader(std::move(data), lopt);
}

TrainResult run_training(const TrainConfig& asked) {
  Timer run_timer;
  // Data parallel (`mpirun -np N lazytrain train ...`): every rank runs this function; rank 0 alone writes.
  const Comm& comm = Comm::world();
  const TrainSettings s = resolve_train_settings(asked, comm);
  const KernelScope kernels = s.backend.kernels();  // cuda-sim: the host ops on the CUDA kernels for the whole run
  TrainingSession session(s, comm);
  const TrainConfig& c = session.config();
  const int64_t total = session.total_steps();
  StopSignals stop;  // SIGTERM / SIGINT: stop after the step in progress (and save there)
  std::string stopped_by, stop_checkpoint;
  while (session.step() < total) {
    session.train_step();
    const int64_t done = session.step();
    const bool saved = c.save_steps > 0 && done % c.save_steps == 0 && done < total;
    if (saved) stop_checkpoint = session.save(done);
    if (c.eval_steps > 0 && done % c.eval_steps == 0 && done < total) session.evaluate(done);
    if (session.any_rank_stopping(stop.requested()) && done < total) {
      stopped_by = stop.requested() ? stop.name() : "SIGTERM";  // seen by another rank
      if (!c.save_on_signal) stop_checkpoint.clear();
      else if (!saved) stop_checkpoint = session.save(done);
      session.log().message(fmt::format("{} at step {}: stopped{}", stopped_by, done,
                                        stop_checkpoint.empty()
                                            ? " without a checkpoint (save_on_signal: false)"
                                            : "; resume with resume_from_checkpoint=true (" + stop_checkpoint + ")"));
      break;
    }
  }
  if (stopped_by.empty()) {
    stop_checkpoint.clear();
    session.save(total);
    session.evaluate(total);
  }
  session.log().finish();
  TrainResult r = session.result(stopped_by.empty() ? total : session.step(), stopped_by, stop_checkpoint,
                                 run_timer.seconds());
  if (s.lead()) write_json_file(c.output_dir + "/summary.json", r.summary);
  // The other ranks leave only once rank 0 has written everything: a launcher ends the job when one rank exits with
  // an error status (a signal's 143), which could otherwise cut rank 0 short.
  comm.barrier(Comm::kWaitForLead);
  return r;
}

}  // namespace lt
