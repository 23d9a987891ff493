#include "train/run_log.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "core/error.h"
#include "io/paths.h"

namespace lt {
namespace {

std::string hms(double s) {
  if (!(s >= 0) || s > 1e7) return "--:--";
  int64_t t = int64_t(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60)
                   : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

}  // namespace

RunLog::RunLog(const std::string& output_dir, int64_t total_steps, bool resume, bool silent)
    : dir_(output_dir), total_(total_steps), tty_(isatty(fileno(stderr))), silent_(silent) {
  if (silent_) return;
  make_directories(dir_, "output_dir");
  const std::string path = dir_ + "/metrics.jsonl";
  metrics_ = std::fopen(path.c_str(), resume ? "a" : "w");
  LT_CHECK(metrics_ != nullptr, "{}: cannot open: {}", path, std::strerror(errno));
  tb_ = std::make_unique<TensorBoardWriter>(dir_ + "/tensorboard");
}

RunLog::~RunLog() {
  if (metrics_) std::fclose(metrics_);
}

void RunLog::draw(int64_t step, double elapsed_s, const std::string& tail) {
  const double frac = total_ > 0 ? double(step) / double(total_) : 0.0;
  const double eta = step > 0 ? elapsed_s / double(step) * double(total_ - step) : -1;
  if (tty_) {
    const int width = 24;
    int filled = int(frac * width + 0.5);
    std::string bar(size_t(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r\033[K%3d%% [%s] %lld/%lld %s<%s %s", int(frac * 100), bar.c_str(), (long long)step,
                 (long long)total_, hms(elapsed_s).c_str(), hms(eta).c_str(), tail.c_str());
    bar_drawn_ = true;
  } else if (!tail.empty()) {
    std::fprintf(stderr, "step %lld/%lld (%d%%) %s elapsed %s eta %s\n", (long long)step, (long long)total_,
                 int(frac * 100), tail.c_str(), hms(elapsed_s).c_str(), hms(eta).c_str());
  }
  std::fflush(stderr);
}

void RunLog::log_step(const nlohmann::json& m) {
  if (silent_) return;
  const int64_t step = m.at("step").get<int64_t>();
  std::string line = m.dump() + "\n";
  LT_CHECK(std::fwrite(line.data(), 1, line.size(), metrics_) == line.size() && std::fflush(metrics_) == 0,
           "{}/metrics.jsonl: write failed: {}", dir_, std::strerror(errno));
  for (const auto& [k, v] : m.items())
    if (v.is_number() && k != "step") tb_->add_scalar("train/" + k, step, v.get<double>());
  tb_->flush();
  const std::string aux = m.contains("aux_loss") ? fmt::format(" aux {:.4f}", m.at("aux_loss").get<double>()) : "";
  last_tail_ = fmt::format("loss {:.4f}{} lr {:.3g} {:.0f} tok/s", m.at("loss").get<double>(), aux,
                           m.at("lr").get<double>(), m.at("tokens_per_s").get<double>());
  draw(step, m.value("elapsed_s", 0.0), last_tail_);
}

void RunLog::log_eval(int64_t step, const nlohmann::json& m) {
  if (silent_) return;
  nlohmann::json line = m;
  line["step"] = step;
  line["kind"] = "eval";
  std::string text = line.dump() + "\n";
  std::fwrite(text.data(), 1, text.size(), metrics_);
  std::fflush(metrics_);
  for (const auto& [k, v] : m.items())
    if (v.is_number()) tb_->add_scalar("eval/" + k, step, v.get<double>());
  tb_->flush();
  message(fmt::format("eval at step {}: {}", step, m.dump()));
}

void RunLog::message(const std::string& text) {
  if (silent_) return;
  if (tty_ && bar_drawn_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", text.c_str());
  bar_drawn_ = false;
  std::fflush(stderr);
}

void RunLog::tick(int64_t step, double elapsed_s) {
  if (silent_) return;
  if (tty_) draw(step, elapsed_s, last_tail_);
}

void RunLog::finish() {
  if (silent_) return;
  if (tty_ && bar_drawn_) std::fprintf(stderr, "\n");
  bar_drawn_ = false;
  tb_->flush();
}

}  // namespace lt
