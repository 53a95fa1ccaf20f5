// MpiCommunicator and MpiContext (mpi_communicator.h). Every MPI call's return code is checked and turned
// into a Status naming the operation, the communicator and the rank; the communicators we own carry
// MPI_ERRORS_RETURN so that such codes come back at all. Chunking of counts above maxCountPerCall() keeps
// every chunk at the same offsets on every rank, so collectives and point-to-point messages match pairwise.
#include "runtime/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "runtime/comm_watchdog.h"
#include "runtime/safetensors.h"  // floatToBf16, bf16ToFloat

namespace ms {

size_t commTypeSize(CommType type) {
  switch (type) {
    case CommType::F32:
      return 4;
    case CommType::F64:
      return 8;
    case CommType::I32:
      return 4;
    case CommType::I64:
      return 8;
    case CommType::U8:
      return 1;
    case CommType::BF16:
      return 2;
  }
  return 0;
}

const char* toString(CommType type) {
  switch (type) {
    case CommType::F32:
      return "f32";
    case CommType::F64:
      return "f64";
    case CommType::I32:
      return "i32";
    case CommType::I64:
      return "i64";
    case CommType::U8:
      return "u8";
    case CommType::BF16:
      return "bf16";
  }
  return "?";
}

const char* toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

std::string mpiErrorString(int mpiError) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(mpiError, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(mpiError);
  return std::string(text, static_cast<size_t>(length));
}

namespace {

MPI_Datatype mpiType(CommType type) {
  switch (type) {
    case CommType::F32:
      return MPI_FLOAT;
    case CommType::F64:
      return MPI_DOUBLE;
    case CommType::I32:
      return MPI_INT32_T;
    case CommType::I64:
      return MPI_INT64_T;
    case CommType::U8:
      return MPI_UINT8_T;
    case CommType::BF16:
      return MPI_UINT16_T;  // the bits; reductions go through bf16Op
  }
  return MPI_DATATYPE_NULL;
}

// bf16 reductions (MPI has no bf16 type): user-defined ops over MPI_UINT16_T that widen each pair exactly,
// combine in fp32 and round to nearest even, as NCCL's bf16 sum does per step. Created on first use (after
// MPI_Init) and kept for the process.
template <ReduceOp Op>
void bf16Reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = bf16ToFloat(a[i]), y = bf16ToFloat(b[i]);
    const float r = Op == ReduceOp::Sum ? x + y : Op == ReduceOp::Max ? std::max(x, y) : std::min(x, y);
    b[i] = floatToBf16(r);
  }
}
template <ReduceOp Op>
MPI_Op bf16Op() {
  static const MPI_Op op = [] {
    MPI_Op o = MPI_OP_NULL;
    MPI_Op_create(&bf16Reduce<Op>, 1, &o);
    return o;
  }();
  return op;
}

MPI_Op mpiOp(ReduceOp op, CommType type) {
  if (type == CommType::BF16) {
    switch (op) {
      case ReduceOp::Sum:
        return bf16Op<ReduceOp::Sum>();
      case ReduceOp::Max:
        return bf16Op<ReduceOp::Max>();
      case ReduceOp::Min:
        return bf16Op<ReduceOp::Min>();
    }
  }
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

// Slices [offset, offset + count) of at most `limit` elements; always at least one (a zero-count call still
// matches its peer's).
struct Chunk {
  size_t offset;
  int count;
};

// No allocation: starting a small operation must cost next to nothing over the raw MPI call.
class Chunks {
 public:
  Chunks(size_t count, size_t limit)
      : m_count(count), m_limit(limit), m_number(count == 0 ? 1 : (count + limit - 1) / limit) {}
  struct Iterator {
    const Chunks* chunks;
    size_t index;
    Chunk operator*() const { return chunks->at(index); }
    Iterator& operator++() {
      ++index;
      return *this;
    }
    bool operator!=(const Iterator& other) const { return index != other.index; }
  };
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, m_number}; }
  Chunk at(size_t index) const {
    const size_t offset = index * m_limit;
    return {offset, static_cast<int>(std::min(m_count - offset, m_limit))};
  }

 private:
  size_t m_count, m_limit, m_number;
};

const char* at(const void* base, size_t elements, size_t elementSize) {
  return static_cast<const char*>(base) + elements * elementSize;
}
char* at(void* base, size_t elements, size_t elementSize) {
  return static_cast<char*>(base) + elements * elementSize;
}

// "allReduce on mpi communicator 'world' (rank 1 of 4)"
std::string describe(const char* op, const std::string& label, int rank, int size) {
  return std::string(op) + " on mpi communicator '" + label + "' (rank " + std::to_string(rank) + " of " +
         std::to_string(size) + ")";
}

// A non-blocking operation made of one MPI_Request per chunk. Receives remember the count they expect so a
// short message is reported instead of silently leaving stale data. The message naming the operation is
// built only on error: starting a small send must cost next to nothing over MPI_Isend (bench/comm.cpp).
class MpiRequest final : public CommRequest {
 public:
  MpiRequest(const char* op, const std::string& label, int rank, int size, MPI_Datatype type)
      : m_op(op), m_label(label), m_rank(rank), m_size(size), m_type(type) {}
  ~MpiRequest() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!m_done && !finalized && !communicationAbandoned()) (void)wait();
  }

  // For a receive: chunk i must bring exactly Chunks(count, limit).at(i).count elements.
  void expectReceive(size_t count, size_t limit) { m_receive = Chunks(count, limit); }
  void add(MPI_Request request) { m_requests.push_back(request); }

  Status wait() override {
    if (m_done) return m_result;
    if (m_requests.size() == 1) {
      MPI_Status status;
      const int rc = MPI_Wait(&m_requests[0], &status);
      finish(rc, &status);
    } else {
      std::vector<MPI_Status> statuses(m_requests.size());
      const int rc = MPI_Waitall(static_cast<int>(m_requests.size()), m_requests.data(), statuses.data());
      finish(rc, statuses.data());
    }
    return m_result;
  }

  bool ready() override {
    if (m_done) return true;
    std::vector<MPI_Status> statuses(m_requests.size());
    int flag = 0;
    const int rc =
        MPI_Testall(static_cast<int>(m_requests.size()), m_requests.data(), &flag, statuses.data());
    if (rc == MPI_SUCCESS && !flag) return false;
    finish(rc, statuses.data());
    return true;
  }

 private:
  void finish(int rc, const MPI_Status* statuses) {
    m_done = true;
    const std::string where = rc == MPI_SUCCESS ? std::string() : describe(m_op, m_label, m_rank, m_size);
    if (rc == MPI_ERR_IN_STATUS) {
      for (size_t i = 0; i < m_requests.size(); ++i)
        if (statuses[i].MPI_ERROR != MPI_SUCCESS && statuses[i].MPI_ERROR != MPI_ERR_PENDING) {
          m_result = Status::error(where + ": " + mpiErrorString(statuses[i].MPI_ERROR));
          return;
        }
    }
    if (rc != MPI_SUCCESS) {
      m_result = Status::error(where + ": " + mpiErrorString(rc));
      return;
    }
    for (size_t i = 0; i < m_requests.size(); ++i) {
      if (!m_receive) break;
      const int expected = m_receive->at(i).count;
      int received = 0;
      MPI_Get_count(&statuses[i], m_type, &received);
      if (received != expected) {
        m_result =
            Status::error(describe(m_op, m_label, m_rank, m_size) + ": received " + std::to_string(received) +
                          " elements, expected " + std::to_string(expected));
        return;
      }
    }
  }

  const char* m_op;
  std::string m_label;
  int m_rank, m_size;
  MPI_Datatype m_type;
  std::vector<MPI_Request> m_requests;
  std::optional<Chunks> m_receive;  // set for receives
  Status m_result;
  bool m_done = false;
};

// The derived datatypes of one allToAllV past MPI's int counts and displacements (mpi_communicator.h), freed
// when the call ends. A block is one element of a struct type: its byte displacement travels as an MPI_Aint,
// its elements as whole chunks of maxCount plus a remainder. Only the type signature has to match the peer's,
// so each rank builds its side from its own offsets.
class LargeBlocks {
 public:
  LargeBlocks(MPI_Datatype element, size_t elementSize, size_t maxCount)
      : m_element(element), m_elementSize(elementSize), m_max(maxCount) {}
  ~LargeBlocks() {
    for (MPI_Datatype& t : m_made) MPI_Type_free(&t);
    if (m_chunk != MPI_DATATYPE_NULL) MPI_Type_free(&m_chunk);
  }
  LargeBlocks(const LargeBlocks&) = delete;
  LargeBlocks& operator=(const LargeBlocks&) = delete;

  // The caller has checked that count / maxCount fits an int.
  int block(size_t offset, size_t count, MPI_Datatype* type) {
    const size_t whole = count / m_max, rest = count % m_max;
    int lengths[2];
    MPI_Aint displacements[2];
    MPI_Datatype types[2];
    int parts = 0;
    if (whole > 0) {
      if (m_chunk == MPI_DATATYPE_NULL) {
        const int rc = MPI_Type_contiguous(static_cast<int>(m_max), m_element, &m_chunk);
        if (rc != MPI_SUCCESS) return rc;
      }
      lengths[parts] = static_cast<int>(whole);
      displacements[parts] = static_cast<MPI_Aint>(offset * m_elementSize);
      types[parts++] = m_chunk;
    }
    if (rest > 0) {
      lengths[parts] = static_cast<int>(rest);
      displacements[parts] = static_cast<MPI_Aint>((offset + whole * m_max) * m_elementSize);
      types[parts++] = m_element;
    }
    MPI_Datatype made = MPI_DATATYPE_NULL;
    int rc = MPI_Type_create_struct(parts, lengths, displacements, types, &made);
    if (rc != MPI_SUCCESS) return rc;
    m_made.push_back(made);
    rc = MPI_Type_commit(&m_made.back());
    *type = m_made.back();
    return rc;
  }

 private:
  MPI_Datatype m_element;
  size_t m_elementSize, m_max;
  MPI_Datatype m_chunk = MPI_DATATYPE_NULL;
  std::vector<MPI_Datatype> m_made;
};

}  // namespace

// ---- MpiCommunicator --------------------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string label, size_t maxCountPerCall, int rank, int size)
    : m_comm(comm), m_label(std::move(label)), m_maxCount(maxCountPerCall), m_rank(rank), m_size(size) {}

Expected<std::unique_ptr<MpiCommunicator>> MpiCommunicator::adopt(MPI_Comm comm, std::string label,
                                                                  size_t maxCountPerCall) {
  const std::string where = "adopting mpi communicator '" + label + "'";
  if (maxCountPerCall == 0 || maxCountPerCall > kMaxCountPerCall)
    return Status::error(where + ": maxCountPerCall must be in 1.." + std::to_string(kMaxCountPerCall));
  int rank = 0, size = 0;
  int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm, &rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &size);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm);
    return Status::error(where + ": " + mpiErrorString(rc));
  }
  return std::unique_ptr<MpiCommunicator>(
      new MpiCommunicator(comm, std::move(label), maxCountPerCall, rank, size));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && m_comm != MPI_COMM_NULL && !communicationAbandoned()) MPI_Comm_free(&m_comm);
}

Expected<std::unique_ptr<MpiCommunicator>> MpiCommunicator::duplicate(size_t maxCountPerCall) const {
  MPI_Comm copy = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(m_comm, &copy);
  if (rc != MPI_SUCCESS) return fail("duplicate", rc);
  return adopt(copy, m_label + "/dup", maxCountPerCall);
}

std::string MpiCommunicator::where(const char* op) const {
  return describe(op, m_label, m_rank, m_size);
}

Status MpiCommunicator::fail(const char* op, int mpiError) const {
  return Status::error(where(op) + ": " + mpiErrorString(mpiError));
}

// Checked here, not left to MPI: a bad root or peer must be an error on every build of MPI (parameter
// checking can be compiled out), and the message can say what the valid range is.
Status MpiCommunicator::checkRank(const char* op, const char* what, int value) const {
  if (value >= 0 && value < m_size) return Status::ok();
  return Status::error(where(op) + ": " + what + " " + std::to_string(value) + " is not a rank of this " +
                       std::to_string(m_size) + "-rank communicator (0.." + std::to_string(m_size - 1) + ")");
}

Status MpiCommunicator::checkBlockCount(const char* op, size_t count) const {
  if (count <= m_maxCount) return Status::ok();
  return Status::error(where(op) + ": " + std::to_string(count) + " elements per rank exceed the " +
                       std::to_string(m_maxCount) +
                       " that one MPI call carries; this operation is not chunked (split the tensor)");
}

Status MpiCommunicator::allReduce(const void* send, void* recv, size_t count, CommType type, ReduceOp op) {
  const size_t es = commTypeSize(type);
  for (const Chunk& c : Chunks(count, m_maxCount)) {
    const void* s = send == recv ? MPI_IN_PLACE : at(send, c.offset, es);
    const int rc = MPI_Allreduce(s, at(recv, c.offset, es), c.count, mpiType(type), mpiOp(op, type), m_comm);
    if (rc != MPI_SUCCESS) return fail("allReduce", rc);
  }
  return Status::ok();
}

Status MpiCommunicator::reduceScatter(const void* send, void* recv, size_t recvCount, CommType type,
                                      ReduceOp op) {
  MS_TRY(checkBlockCount("reduceScatter", recvCount));
  const void* s = send == recv ? MPI_IN_PLACE : send;
  const int rc =
      MPI_Reduce_scatter_block(s, recv, static_cast<int>(recvCount), mpiType(type), mpiOp(op, type), m_comm);
  return rc == MPI_SUCCESS ? Status::ok() : fail("reduceScatter", rc);
}

Status MpiCommunicator::allGather(const void* send, void* recv, size_t sendCount, CommType type) {
  MS_TRY(checkBlockCount("allGather", sendCount));
  const int n = static_cast<int>(sendCount);
  const bool inPlace = send == at(recv, size_t(m_rank) * sendCount, commTypeSize(type));
  const int rc = inPlace ? MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, mpiType(type), m_comm)
                         : MPI_Allgather(send, n, mpiType(type), recv, n, mpiType(type), m_comm);
  return rc == MPI_SUCCESS ? Status::ok() : fail("allGather", rc);
}

Status MpiCommunicator::broadcast(void* data, size_t count, CommType type, int root) {
  MS_TRY(checkRank("broadcast", "root", root));
  const size_t es = commTypeSize(type);
  for (const Chunk& c : Chunks(count, m_maxCount)) {
    const int rc = MPI_Bcast(at(data, c.offset, es), c.count, mpiType(type), root, m_comm);
    if (rc != MPI_SUCCESS) return fail("broadcast", rc);
  }
  return Status::ok();
}

Status MpiCommunicator::send(const void* data, size_t count, CommType type, int peer, int tag) {
  MS_TRY(checkRank("send", "peer", peer));
  const size_t es = commTypeSize(type);
  for (const Chunk& c : Chunks(count, m_maxCount)) {
    const int rc = MPI_Send(at(data, c.offset, es), c.count, mpiType(type), peer, tag, m_comm);
    if (rc != MPI_SUCCESS) return fail("send", rc);
  }
  return Status::ok();
}

Status MpiCommunicator::recv(void* data, size_t count, CommType type, int peer, int tag) {
  MS_TRY(checkRank("recv", "peer", peer));
  const size_t es = commTypeSize(type);
  for (const Chunk& c : Chunks(count, m_maxCount)) {
    MPI_Status status;
    const int rc = MPI_Recv(at(data, c.offset, es), c.count, mpiType(type), peer, tag, m_comm, &status);
    if (rc != MPI_SUCCESS) return fail("recv", rc);
    int received = 0;
    MPI_Get_count(&status, mpiType(type), &received);
    if (received != c.count)
      return Status::error(where("recv") + ": received " + std::to_string(received) + " elements from rank " +
                           std::to_string(peer) + ", expected " + std::to_string(c.count));
  }
  return Status::ok();
}

Status MpiCommunicator::barrier() {
  const int rc = MPI_Barrier(m_comm);
  return rc == MPI_SUCCESS ? Status::ok() : fail("barrier", rc);
}

Status MpiCommunicator::allToAllV(const void* send, const size_t* sendCounts, const size_t* sendOffsets,
                                  void* recv, const size_t* recvCounts, const size_t* recvOffsets,
                                  CommType type) {
  // The path every rank takes: MPI_Alltoallv and MPI_Alltoallw do not match each other, so one rank's large
  // count or offset moves every rank to the large path, and a block that not even that can carry makes every
  // rank return an error (none may be left waiting in the collective).
  enum Path : int { kImpossible = 0, kLarge = 1, kSmall = 2 };
  const size_t n = static_cast<size_t>(m_size);
  int mine = kSmall;
  std::string impossible;
  for (size_t r = 0; r < n; ++r) {
    if (std::max({sendCounts[r], sendOffsets[r], recvCounts[r], recvOffsets[r]}) > m_maxCount &&
        mine == kSmall)
      mine = kLarge;
    for (const size_t count : {sendCounts[r], recvCounts[r]})
      if (count / m_maxCount > size_t(INT_MAX) && impossible.empty()) {
        mine = kImpossible;
        impossible = std::to_string(count) + " elements to or from rank " + std::to_string(r) +
                     " need more than INT_MAX chunks of " + std::to_string(m_maxCount) + " elements";
      }
  }
  int path = kImpossible;
  int rc = MPI_Allreduce(&mine, &path, 1, MPI_INT, MPI_MIN, m_comm);
  if (rc != MPI_SUCCESS) return fail("allToAllV", rc);
  if (path == kImpossible)
    return Status::error(where("allToAllV") + ": " +
                         (impossible.empty() ? "another rank's block is too large for MPI" : impossible));

  const MPI_Datatype element = mpiType(type);
  if (path == kSmall) {
    std::vector<int> counts(4 * n);  // send counts, send offsets, receive counts, receive offsets
    for (size_t r = 0; r < n; ++r) {
      counts[r] = static_cast<int>(sendCounts[r]);
      counts[n + r] = static_cast<int>(sendOffsets[r]);
      counts[2 * n + r] = static_cast<int>(recvCounts[r]);
      counts[3 * n + r] = static_cast<int>(recvOffsets[r]);
    }
    rc = MPI_Alltoallv(send, &counts[0], &counts[n], element, recv, &counts[2 * n], &counts[3 * n], element,
                       m_comm);
    return rc == MPI_SUCCESS ? Status::ok() : fail("allToAllV", rc);
  }

  // Every non-empty block is one element of its own datatype at displacement 0; empty ones send nothing.
  LargeBlocks blocks(element, commTypeSize(type), m_maxCount);
  std::vector<int> counts(2 * n), displacements(2 * n, 0);
  std::vector<MPI_Datatype> types(2 * n, element);
  for (size_t r = 0; r < n; ++r)
    for (const bool sending : {true, false}) {
      const size_t count = sending ? sendCounts[r] : recvCounts[r];
      const size_t i = sending ? r : n + r;
      if (count == 0) continue;
      counts[i] = 1;
      rc = blocks.block(sending ? sendOffsets[r] : recvOffsets[r], count, &types[i]);
      if (rc != MPI_SUCCESS) return fail("allToAllV (building a datatype for the large path)", rc);
    }
  rc = MPI_Alltoallw(send, &counts[0], &displacements[0], &types[0], recv, &counts[n], &displacements[n],
                     &types[n], m_comm);
  return rc == MPI_SUCCESS ? Status::ok() : fail("allToAllV", rc);
}

Expected<CommRequestPtr> MpiCommunicator::iallReduce(const void* send, void* recv, size_t count,
                                                     CommType type, ReduceOp op) {
  const size_t es = commTypeSize(type);
  auto request = std::make_unique<MpiRequest>("iallReduce", m_label, m_rank, m_size, mpiType(type));
  for (const Chunk& c : Chunks(count, m_maxCount)) {
    const void* s = send == recv ? MPI_IN_PLACE : at(send, c.offset, es);
    MPI_Request r;
    const int rc =
        MPI_Iallreduce(s, at(recv, c.offset, es), c.count, mpiType(type), mpiOp(op, type), m_comm, &r);
    if (rc != MPI_SUCCESS) return fail("iallReduce", rc);
    request->add(r);
  }
  return CommRequestPtr(std::move(request));
}

Expected<CommRequestPtr> MpiCommunicator::ireduceScatter(const void* send, void* recv, size_t recvCount,
                                                         CommType type, ReduceOp op) {
  MS_TRY(checkBlockCount("ireduceScatter", recvCount));
  const void* s = send == recv ? MPI_IN_PLACE : send;
  MPI_Request r;
  const int rc = MPI_Ireduce_scatter_block(s, recv, static_cast<int>(recvCount), mpiType(type),
                                           mpiOp(op, type), m_comm, &r);
  if (rc != MPI_SUCCESS) return fail("ireduceScatter", rc);
  auto request = std::make_unique<MpiRequest>("ireduceScatter", m_label, m_rank, m_size, mpiType(type));
  request->add(r);
  return CommRequestPtr(std::move(request));
}

Expected<CommRequestPtr> MpiCommunicator::iallGather(const void* send, void* recv, size_t sendCount,
                                                     CommType type) {
  MS_TRY(checkBlockCount("iallGather", sendCount));
  const int n = static_cast<int>(sendCount);
  const bool inPlace = send == at(recv, size_t(m_rank) * sendCount, commTypeSize(type));
  MPI_Request r;
  const int rc = inPlace
                     ? MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, mpiType(type), m_comm, &r)
                     : MPI_Iallgather(send, n, mpiType(type), recv, n, mpiType(type), m_comm, &r);
  if (rc != MPI_SUCCESS) return fail("iallGather", rc);
  auto request = std::make_unique<MpiRequest>("iallGather", m_label, m_rank, m_size, mpiType(type));
  request->add(r);
  return CommRequestPtr(std::move(request));
}

Expected<CommRequestPtr> MpiCommunicator::ibroadcast(void* data, size_t count, CommType type, int root) {
  MS_TRY(checkRank("ibroadcast", "root", root));
  const size_t es = commTypeSize(type);
  auto request = std::make_unique<MpiRequest>("ibroadcast", m_label, m_rank, m_size, mpiType(type));
  for (const Chunk& c : Chunks(count, m_maxCount)) {
    MPI_Request r;
    const int rc = MPI_Ibcast(at(data, c.offset, es), c.count, mpiType(type), root, m_comm, &r);
    if (rc != MPI_SUCCESS) return fail("ibroadcast", rc);
    request->add(r);
  }
  return CommRequestPtr(std::move(request));
}

Expected<CommRequestPtr> MpiCommunicator::isend(const void* data, size_t count, CommType type, int peer,
                                                int tag) {
  MS_TRY(checkRank("isend", "peer", peer));
  const size_t es = commTypeSize(type);
  auto request = std::make_unique<MpiRequest>("isend", m_label, m_rank, m_size, mpiType(type));
  for (const Chunk& c : Chunks(count, m_maxCount)) {
    MPI_Request r;
    const int rc = MPI_Isend(at(data, c.offset, es), c.count, mpiType(type), peer, tag, m_comm, &r);
    if (rc != MPI_SUCCESS) return fail("isend", rc);
    request->add(r);
  }
  return CommRequestPtr(std::move(request));
}

Expected<CommRequestPtr> MpiCommunicator::irecv(void* data, size_t count, CommType type, int peer, int tag) {
  MS_TRY(checkRank("irecv", "peer", peer));
  const size_t es = commTypeSize(type);
  auto request = std::make_unique<MpiRequest>("irecv", m_label, m_rank, m_size, mpiType(type));
  request->expectReceive(count, m_maxCount);
  for (const Chunk& c : Chunks(count, m_maxCount)) {
    MPI_Request r;
    const int rc = MPI_Irecv(at(data, c.offset, es), c.count, mpiType(type), peer, tag, m_comm, &r);
    if (rc != MPI_SUCCESS) return fail("irecv", rc);
    request->add(r);
  }
  return CommRequestPtr(std::move(request));
}

Expected<std::unique_ptr<Communicator>> MpiCommunicator::split(int color, int key) {
  MPI_Comm part = MPI_COMM_NULL;
  const int rc = MPI_Comm_split(m_comm, color < 0 ? MPI_UNDEFINED : color, key, &part);
  if (rc != MPI_SUCCESS) return fail("split", rc);
  if (part == MPI_COMM_NULL) return std::unique_ptr<Communicator>();
  auto adopted = adopt(part, m_label + "/split(" + std::to_string(color) + ")", m_maxCount);
  if (!adopted) return adopted.status();
  return std::unique_ptr<Communicator>(std::move(*adopted));
}

// ---- MpiContext -------------------------------------------------------------------------------------------

Expected<std::unique_ptr<MpiContext>> MpiContext::create(int* argc, char*** argv) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized || finalized)
    return Status::error(
        "starting MPI: MPI was already initialised in this process (one MpiContext per "
        "process, made by main())");
  int provided = 0;
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) return Status::error("starting MPI (MPI_Init_thread): " + mpiErrorString(rc));
  std::unique_ptr<MpiContext> context(new MpiContext());  // from here on its destructor finalises MPI
  if (provided < MPI_THREAD_FUNNELED)
    return Status::error("starting MPI: the library provides thread level " + std::to_string(provided) +
                         ", below MPI_THREAD_FUNNELED");
  MPI_Comm world = MPI_COMM_NULL;
  rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &world);
  if (rc != MPI_SUCCESS)
    return Status::error("starting MPI (duplicating MPI_COMM_WORLD): " + mpiErrorString(rc));
  auto adopted = MpiCommunicator::adopt(world, "world");
  if (!adopted) return adopted.status();
  context->m_world = std::move(*adopted);
  return context;
}

MpiContext::~MpiContext() {
  if (communicationAbandoned()) {
    // A wait was abandoned (comm_watchdog.h): peers may be stuck in that operation, and MPI_Finalize (or
    // freeing communicators) would wait for them for ever. End the job instead, the other ranks a moment
    // after rank 0, so that rank 0 can end its metrics stream first.
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    (void)m_world.release();
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  m_world.reset();
  MPI_Finalize();
}

}  // namespace ms
