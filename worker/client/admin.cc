// AdminCalls (worker/client/admin.h).
#include "worker/client/admin.h"

#include <memory>

#include "worker/client/core.h"

namespace asyncps::worker::client {

namespace {

// Each shard's stats text into texts[shard].
class StatsReader : public ReplyReader {
 public:
  explicit StatsReader(std::vector<std::string>* texts) : texts_(texts) {}
  Status Read(const Reply& r, TicketResult*) override {
    (*texts_)[r.shard] = r.header->text;
    return Status::OK();
  }

 private:
  std::vector<std::string>* texts_;
};

}  // namespace

Status AdminCalls::Stats(std::vector<std::string>* replies,
                         std::chrono::milliseconds timeout) {
  std::vector<std::string> texts(core_->num_shards());
  Status s = [&]() -> Status {
    ASSIGN_OR_RETURN(
        Ticket t, core_->StartOnShards(core_->NewHeader(RequestKind::kStats),
                                       core_->AllShards(),
                                       std::make_unique<StatsReader>(&texts)));
    return core_->Wait(t, timeout, nullptr);
  }();
  *replies = std::move(texts);
  return s;
}

Status AdminCalls::Simple(RequestKind kind, std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(Ticket t, core_->StartOnShards(core_->NewHeader(kind),
                                                  core_->AllShards()));
  return core_->Wait(t, timeout, nullptr);
}

}  // namespace asyncps::worker::client
