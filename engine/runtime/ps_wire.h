// The parameter-server wire: ZeroMQ messages of a JSON header frame and an optional float payload frame
// (runtime/ps.h). Internal to ps_server.cpp and ps_worker.cpp.
//
// Worker -> server headers ("type"):
//   pull   worker, req, min_version, incarnation      the shard's parameters, when the consistency allows
//   push   worker, req, version, incarnation, loss_sum, count, correct, compute_s, samples   + gradients
//   eval   worker, step, loss, accuracy, samples, time_s (server 0)
//   beat   worker, progress                              (heartbeat thread, own socket)
//   bye    worker, complete                              (leaving: complete when the run is done)
// Server -> worker: params   req, version, incarnation, done, batch, slot, evaluate, eval_step   + values
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

namespace ms::ps {

namespace msg {
inline constexpr char kPull[] = "pull";
inline constexpr char kPush[] = "push";
inline constexpr char kEval[] = "eval";
inline constexpr char kBeat[] = "beat";
inline constexpr char kBye[] = "bye";
inline constexpr char kParams[] = "params";
}  // namespace msg

// Seconds from t to now on the steady clock (timeouts, rates).
inline double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Seconds since the Unix epoch on the system clock: span times that processes compare with each other.
inline double wallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Message {
  std::string peer;  // the ROUTER's routing id of the sender (server side)
  nlohmann::json header;
  std::vector<float> payload;
};

// Sends [peer?][header][payload?]. False when ZeroMQ could not queue it (the peer is gone and the queue
// full): the caller treats the message as lost, as it would on a dead link.
bool send(zmq::socket_t& socket, const nlohmann::json& header, const float* payload = nullptr,
          size_t count = 0, const std::string* peer = nullptr);
// Receives one message without blocking (nullopt when none is waiting, or a malformed one, which is dropped).
// withPeer: the socket is a ROUTER (a routing-id frame comes first).
std::optional<Message> receive(zmq::socket_t& socket, bool withPeer);

}  // namespace ms::ps
