// Client (worker/client.h): the factory and the endpoint lists. The
// implementation is ClientCore and the types around it in worker/client/.
#include "worker/client.h"

#include "worker/client/core.h"

namespace asyncps::worker {

namespace {

// Splits `list` at `sep`, dropping empty items.
std::vector<std::string> Split(const std::string& list, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(sep, pos);
    if (end == std::string::npos) end = list.size();
    if (end > pos) out.push_back(list.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

}  // namespace

std::vector<std::string> ParseReplicaGroup(const std::string& group) {
  return Split(group, '|');
}

std::vector<std::string> ParseEndpoints(const std::string& list) {
  return Split(list, ',');
}

StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  auto c = std::make_unique<client::ClientCore>(options);
  RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<Client>(std::move(c));
}

}  // namespace asyncps::worker
