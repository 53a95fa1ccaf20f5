// The parameter-server wire; see ps_wire.h.
#include "runtime/ps_wire.h"

#include <cstring>

namespace ms::ps {

bool send(zmq::socket_t& socket, const nlohmann::json& header, const float* payload, size_t count,
          const std::string* peer) {
  try {
    const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    if (peer && !socket.send(zmq::buffer(*peer), more)) return false;
    const std::string text = header.dump();
    if (!socket.send(zmq::buffer(text), payload ? more : zmq::send_flags::dontwait)) return false;
    if (payload && !socket.send(zmq::buffer(payload, count * sizeof(float)), zmq::send_flags::dontwait))
      return false;
    return true;
  } catch (const zmq::error_t&) {
    return false;
  }
}

std::optional<Message> receive(zmq::socket_t& socket, bool withPeer) {
  std::vector<zmq::message_t> parts;
  try {
    zmq::message_t part;
    if (!socket.recv(part, zmq::recv_flags::dontwait)) return std::nullopt;
    parts.push_back(std::move(part));
    while (parts.back().more()) {
      zmq::message_t next;
      if (!socket.recv(next, zmq::recv_flags::none)) break;
      parts.push_back(std::move(next));
    }
  } catch (const zmq::error_t&) {
    return std::nullopt;
  }
  size_t i = 0;
  Message m;
  if (withPeer) {
    if (parts.size() < 2) return std::nullopt;
    m.peer = parts[i++].to_string();
  }
  if (i >= parts.size()) return std::nullopt;
  m.header = nlohmann::json::parse(parts[i].to_string_view(), nullptr, /*allow_exceptions=*/false);
  if (!m.header.is_object() || !m.header.contains("type")) return std::nullopt;
  ++i;
  if (i < parts.size()) {
    const zmq::message_t& p = parts[i];
    if (p.size() % sizeof(float) != 0) return std::nullopt;
    m.payload.resize(p.size() / sizeof(float));
    if (p.size()) std::memcpy(m.payload.data(), p.data(), p.size());
  }
  return m;
}

}  // namespace ms::ps
