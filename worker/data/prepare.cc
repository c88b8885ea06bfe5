#include "worker/data/prepare.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tokenizers.h"
#include "worker/data/tokens.h"

namespace shardtrain::data {
namespace {
namespace fs = std::filesystem;

constexpr size_t kChunkBytes = size_t{256} << 10;
constexpr int64_t kBatchBytes = int64_t{64} << 20;

bool Printable(char c) { return c >= 0x21 && c <= 0x7e; }

// A byte range of one input file, tokenized as one document.
struct Segment {
  std::string path;
  int64_t begin = 0, end = 0;
};

// Every regular file `input` stands for, in sorted path order.
absl::Status ListFiles(const std::string& input, std::vector<std::string>* files) {
  std::error_code ec;
  if (!fs::exists(input, ec)) return absl::NotFoundError(absl::StrCat(input, " does not exist"));
  if (!fs::is_directory(input, ec)) {
    files->push_back(input);
    return absl::OkStatus();
  }
  std::vector<std::string> found;
  for (auto it = fs::recursive_directory_iterator(input, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file()) found.push_back(it->path().string());
  }
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("cannot list ", input, ": ", ec.message()));
  if (found.empty()) return absl::NotFoundError(absl::StrCat(input, " holds no files"));
  std::sort(found.begin(), found.end());
  files->insert(files->end(), found.begin(), found.end());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Segment>> Segments(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    if (absl::Status s = ListFiles(in, &files); !s.ok()) return s;
  }
  std::vector<Segment> out;
  for (const std::string& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    if (ec) return absl::NotFoundError(absl::StrCat("cannot read ", f, ": ", ec.message()));
    if (::access(f.c_str(), R_OK) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot read ", f, ": ", std::strerror(errno)));
    }
    out.push_back({f, 0, static_cast<int64_t>(size)});
  }
  return out;
}

absl::StatusOr<std::string> ReadRange(const Segment& s) {
  std::ifstream in(s.path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot read ", s.path, ": ", std::strerror(errno)));
  std::string text(static_cast<size_t>(s.end - s.begin), '\0');
  in.seekg(s.begin);
  if (!text.empty() && !in.read(text.data(), static_cast<std::streamsize>(text.size()))) {
    return absl::DataLossError(absl::StrCat("error reading ", s.path, " (it changed while read?)"));
  }
  return text;
}

// Moves the last `fraction` of the bytes of *train into the returned val
// segments, splitting the document the cut falls in at a safe cut.
absl::StatusOr<std::vector<Segment>> HoldOut(std::vector<Segment>* train, double fraction) {
  int64_t total = 0;
  for (const Segment& s : *train) total += s.end - s.begin;
  int64_t cut = total - static_cast<int64_t>(double(total) * fraction);
  std::vector<Segment> kept, val;
  int64_t at = 0;
  for (const Segment& s : *train) {
    const int64_t size = s.end - s.begin;
    if (at + size <= cut) {
      kept.push_back(s);
    } else if (at >= cut) {
      val.push_back(s);
    } else {
      absl::StatusOr<std::string> text = ReadRange(s);
      if (!text.ok()) return text.status();
      std::vector<size_t> cuts = SafeCuts(*text, 1);
      auto it = std::lower_bound(cuts.begin(), cuts.end(), size_t(cut - at));
      const int64_t split = it == cuts.end() ? size : int64_t(*it);
      if (split > 0) kept.push_back({s.path, s.begin, s.begin + split});
      if (split < size) val.push_back({s.path, s.begin + split, s.end});
    }
    at += size;
  }
  *train = std::move(kept);
  return val;
}

// Writes shards of at most `limit` tokens as dir/000000.bin, ..., of
// uint16 tokens, or uint32 when `wide`.
class ShardWriter {
 public:
  ShardWriter(std::string dir, int64_t limit, bool wide)
      : dir_(std::move(dir)), limit_(limit), wide_(wide) {}
  absl::Status Append(const uint32_t* t, size_t n) {
    while (n > 0) {
      const size_t take = std::min<size_t>(n, size_t(limit_) - buffered());
      if (wide_) {
        wide_buffer_.insert(wide_buffer_.end(), t, t + take);
      } else {
        narrow_buffer_.insert(narrow_buffer_.end(), t, t + take);  // ids < 65536: checked
      }
      t += take;
      n -= take;
      total_ += int64_t(take);
      if (int64_t(buffered()) == limit_) {
        if (absl::Status s = Flush(); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }
  absl::Status Flush() {
    if (buffered() == 0) return absl::OkStatus();
    char name[16];
    std::snprintf(name, sizeof(name), "%06zu.bin", files_.size());
    const std::string path = (fs::path(dir_) / name).string();
    const TokenIds ids =
        wide_ ? TokenIds(std::move(wide_buffer_)) : TokenIds(std::move(narrow_buffer_));
    wide_buffer_ = {};
    narrow_buffer_ = {};
    if (absl::Status s = WriteLlmcTokens(path, ids); !s.ok()) return s;
    files_.push_back(name);
    return absl::OkStatus();
  }
  int64_t total() const { return total_; }
  const std::vector<std::string>& files() const { return files_; }

 private:
  size_t buffered() const { return wide_ ? wide_buffer_.size() : narrow_buffer_.size(); }

  const std::string dir_;
  const int64_t limit_;
  const bool wide_;
  std::vector<uint16_t> narrow_buffer_;
  std::vector<uint32_t> wide_buffer_;
  std::vector<std::string> files_;
  int64_t total_ = 0;
};

class Preparer {
 public:
  Preparer(const PrepareOptions& o, const ByteLevelBpe* bpe, int64_t bytes_total)
      : o_(o), bpe_(bpe), t0_(std::chrono::steady_clock::now()) {
    progress_.bytes_total = bytes_total;
  }

  // Tokenizes `segments` into shards under dir.
  absl::Status Run(const std::vector<Segment>& segments, ShardWriter* out) {
    size_t next = 0;
    while (next < segments.size()) {
      // A batch: whole segments up to ~kBatchBytes (at least one).
      std::vector<std::string> texts;
      int64_t bytes = 0;
      while (next < segments.size() && (texts.empty() || bytes < kBatchBytes)) {
        absl::StatusOr<std::string> text = ReadRange(segments[next++]);
        if (!text.ok()) return text.status();
        bytes += int64_t(text->size());
        texts.push_back(*std::move(text));
      }
      // Its chunks, encoded by the threads, written in order.
      struct Chunk {
        size_t text;
        size_t begin, end;
        std::vector<int> ids;
      };
      std::vector<Chunk> chunks;
      for (size_t t = 0; t < texts.size(); ++t) {
        size_t begin = 0;
        for (size_t cut : SafeCuts(texts[t], kChunkBytes)) {
          chunks.push_back({t, begin, cut, {}});
          begin = cut;
        }
        chunks.push_back({t, begin, texts[t].size(), {}});
      }
      std::atomic<size_t> claim{0};
      auto work = [&] {
        ByteLevelBpe::Cache cache;
        for (size_t i; (i = claim.fetch_add(1)) < chunks.size();) {
          Chunk& c = chunks[i];
          const std::string_view text(texts[c.text].data() + c.begin, c.end - c.begin);
          if (bpe_ != nullptr) {
            ByteLevelBpe::EncodeOptions options;  // special tokens' text is text
            options.document_start = c.begin == 0;
            bpe_->Encode(text, &c.ids, &cache, options);
          } else {
            c.ids.assign(text.begin(), text.end());
            for (int& id : c.ids) id &= 0xff;
          }
        }
      };
      std::vector<std::thread> pool;
      for (int i = 1; i < o_.threads; ++i) pool.emplace_back(work);
      work();
      for (std::thread& t : pool) t.join();
      std::vector<uint32_t> tokens;
      const int document = bpe_ != nullptr ? bpe_->document_token() : -1;
      for (size_t i = 0; i < chunks.size(); ++i) {
        if (document >= 0 && chunks[i].begin == 0) tokens.push_back(uint32_t(document));
        tokens.insert(tokens.end(), chunks[i].ids.begin(), chunks[i].ids.end());
      }
      if (absl::Status s = out->Append(tokens.data(), tokens.size()); !s.ok()) return s;
      progress_.bytes_done += bytes;
      progress_.tokens += int64_t(tokens.size());
      progress_.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
      if (o_.progress) o_.progress(progress_);
    }
    return out->Flush();
  }

  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  const PrepareOptions& o_;
  const ByteLevelBpe* bpe_;
  const std::chrono::steady_clock::time_point t0_;
  PrepareProgress progress_;
};

absl::Status CheckOptions(const PrepareOptions& o) {
  if (o.inputs.empty()) return absl::InvalidArgumentError("prepare: no input files");
  if (o.out_dir.empty()) return absl::InvalidArgumentError("prepare: --out: a directory is needed");
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("prepare: --val-fraction: ", o.val_fraction, " is not in [0, 1)"));
  }
  if (o.val_fraction > 0 && !o.val_inputs.empty()) {
    return absl::InvalidArgumentError("prepare: --val-fraction and --val exclude each other");
  }
  if (o.shard_tokens < 1 || o.shard_tokens > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("prepare: --shard-tokens: ", o.shard_tokens,
                                                   " is not in [1, 2^31) (llm.c's header)"));
  }
  if (o.tokenizer == TokenizerKind::kJson && o.tokenizer_path.empty()) {
    return absl::InvalidArgumentError("prepare: --tokenizer-json: a tokenizer.json is needed");
  }
  if (o.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prepare: --threads: ", o.threads, " is not >= 1"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<size_t> SafeCuts(const std::string& text, size_t chunk) {
  std::vector<size_t> cuts;
  size_t i = std::max<size_t>(chunk, 2);
  while (i < text.size()) {
    if (text[i - 1] == '\n' && Printable(text[i - 2]) && Printable(text[i])) {
      cuts.push_back(i);
      i += std::max<size_t>(chunk, 1);  // the next cut at least `chunk` further
    } else {
      ++i;
    }
  }
  return cuts;
}

absl::StatusOr<PrepareSummary> Prepare(const PrepareOptions& o) {
  if (absl::Status s = CheckOptions(o); !s.ok()) return s;
  std::error_code ec;
  const fs::path out = fs::path(o.out_dir);
  if (fs::exists(out, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat(o.out_dir, " exists: remove it or choose another --out"));
  }
  absl::StatusOr<std::vector<Segment>> train = Segments(o.inputs);
  if (!train.ok()) return train.status();
  std::vector<Segment> val;
  if (!o.val_inputs.empty()) {
    absl::StatusOr<std::vector<Segment>> v = Segments(o.val_inputs);
    if (!v.ok()) return v.status();
    val = *std::move(v);
  } else if (o.val_fraction > 0) {
    absl::StatusOr<std::vector<Segment>> v = HoldOut(&*train, o.val_fraction);
    if (!v.ok()) return v.status();
    val = *std::move(v);
  }
  std::unique_ptr<ByteLevelBpe> bpe;
  PrepareSummary summary;
  if (o.tokenizer != TokenizerKind::kByte) {
    absl::StatusOr<std::unique_ptr<ByteLevelBpe>> b = LoadTokenizer(o.tokenizer, o.tokenizer_path);
    if (!b.ok()) return b.status();
    bpe = *std::move(b);
    summary.document_token = bpe->document_token();
    summary.vocab_size = bpe->vocab_size();
  }
  const bool wide = summary.vocab_size > 65536;
  summary.token_bytes = wide ? 4 : 2;
  for (const auto* list : {&*train, &val}) {
    for (const Segment& s : *list) summary.bytes += s.end - s.begin;
    summary.documents += int64_t(list->size());
  }

  // Everything under a temporary sibling, renamed into place at the end.
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  const fs::path tmp = parent / absl::StrCat(".", out.filename().string(), ".partial-", ::getpid());
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp / "train", ec) ||
      (!val.empty() && !fs::create_directories(tmp / "val", ec))) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", tmp.string(), ": ", ec.message()));
  }
  auto fail = [&](absl::Status s) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    return s;
  };
  Preparer preparer(o, bpe.get(), summary.bytes);
  ShardWriter train_out((tmp / "train").string(), o.shard_tokens, wide);
  if (absl::Status s = preparer.Run(*train, &train_out); !s.ok()) return fail(s);
  ShardWriter val_out((tmp / "val").string(), o.shard_tokens, wide);
  if (!val.empty()) {
    if (absl::Status s = preparer.Run(val, &val_out); !s.ok()) return fail(s);
  }
  fs::rename(tmp, out, ec);
  if (ec) {
    return fail(absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp.string(), " to ", o.out_dir, ": ", ec.message())));
  }
  summary.train_tokens = train_out.total();
  summary.val_tokens = val_out.total();
  for (const std::string& f : train_out.files()) {
    summary.train_shards.push_back((out / "train" / f).string());
  }
  for (const std::string& f : val_out.files()) {
    summary.val_shards.push_back((out / "val" / f).string());
  }
  summary.seconds = preparer.seconds();
  return summary;
}

}  // namespace shardtrain::data
