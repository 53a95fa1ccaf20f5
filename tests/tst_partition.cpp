// Partitions: even splits, the balanced split against brute force, placements from the config and back.
#include <QtTest>

#include <algorithm>
#include <functional>

#include "plan/partition.h"

using namespace ms;

namespace {

ModelSpec gptSpec(int layers) {
  ModelConfig m;
  m.layers = layers;
  return buildModelSpec(m, 64);
}

double bottleneck(const Partition& p, const std::vector<double>& cost) {
  std::vector<double> stage(p.stages, 0.0);
  for (size_t k = 0; k < p.chunks.size(); ++k)
    for (int l : p.chunks[k]) stage[p.stageOf[k]] += cost[l];
  return *std::max_element(stage.begin(), stage.end());
}

// The best bottleneck over every way to cut L layers into K non-empty contiguous parts.
double bruteForce(const std::vector<double>& cost, int K) {
  const int L = static_cast<int>(cost.size());
  double best = 1e300;
  std::function<void(int, int, double)> go = [&](int start, int parts, double worst) {
    if (parts == 1) {
      double s = 0;
      for (int i = start; i < L; ++i) s += cost[i];
      best = std::min(best, std::max(worst, s));
      return;
    }
    double s = 0;
    for (int end = start + 1; end <= L - parts + 1; ++end) {
      s += cost[end - 1];
      go(end, parts - 1, std::max(worst, s));
    }
  };
  go(0, K, 0.0);
  return best;
}

void checkInvariants(const Partition& p, int layers) {
  int next = 0;
  for (const auto& chunk : p.chunks) {
    QVERIFY(!chunk.empty());
    for (int l : chunk) QCOMPARE(l, next++);
  }
  QCOMPARE(next, layers);
  QCOMPARE(static_cast<int>(p.stageOf.size()), p.stages * p.chunksPerStage);
  for (int s = 0; s < p.stages; ++s) QCOMPARE(static_cast<int>(p.chunksOfStage(s).size()), p.chunksPerStage);
}

}  // namespace

class TestPartition : public QObject {
  Q_OBJECT
 private slots:
  void even_data() {
    QTest::addColumn<int>("layers");
    QTest::addColumn<int>("stages");
    QTest::addColumn<int>("chunks");
    QTest::addColumn<QList<int>>("sizes");
    // gpt layers = blocks + 2 (embedding, head)
    QTest::newRow("6 over 2") << 4 << 2 << 1 << QList<int>{3, 3};
    QTest::newRow("7 over 3") << 5 << 3 << 1 << QList<int>{3, 2, 2};
    QTest::newRow("10 over 2x2") << 8 << 2 << 2 << QList<int>{3, 3, 2, 2};
    QTest::newRow("one stage") << 2 << 1 << 1 << QList<int>{4};
  }
  void even() {
    QFETCH(int, layers);
    QFETCH(int, stages);
    QFETCH(int, chunks);
    QFETCH(QList<int>, sizes);
    const ModelSpec m = gptSpec(layers);
    const Partition p = evenPartition(m, stages, chunks);
    checkInvariants(p, layers + 2);
    QCOMPARE(p.chunks.size(), size_t(sizes.size()));
    for (int k = 0; k < sizes.size(); ++k) {
      QCOMPARE(static_cast<int>(p.chunks[k].size()), sizes[k]);
      QCOMPARE(p.stageOf[k], k % stages);
    }
  }

  void balancedMatchesBruteForce_data() {
    QTest::addColumn<int>("stages");
    QTest::addColumn<int>("seed");
    for (int s : {2, 3, 4})
      for (int seed : {1, 2, 3}) QTest::newRow(qPrintable(QString("P%1 seed%2").arg(s).arg(seed))) << s << seed;
  }
  void balancedMatchesBruteForce() {
    QFETCH(int, stages);
    QFETCH(int, seed);
    const ModelSpec m = gptSpec(7);  // 9 layers
    std::vector<double> cost;
    unsigned x = static_cast<unsigned>(seed) * 2654435761u;
    for (size_t i = 0; i < m.layers.size(); ++i) {
      x = x * 1664525u + 1013904223u;
      cost.push_back(1.0 + (x >> 24) % 10);
    }
    const Partition p = balancedPartition(m, stages, 1, cost);
    checkInvariants(p, 9);
    QCOMPARE(bottleneck(p, cost), bruteForce(cost, stages));
    QVERIFY(bottleneck(p, cost) <= bottleneck(evenPartition(m, stages, 1), cost));
  }

  // A heavy head (large vocabulary) pushes blocks off the last stage.
  void balancedAccountsForEmbeddingAndHead() {
    const ModelSpec m = gptSpec(6);
    std::vector<double> cost(m.layers.size(), 1.0);
    cost.back() = 3.0;  // head = three blocks
    const Partition p = balancedPartition(m, 2, 1, cost);
    QCOMPARE(bottleneck(p, cost), 5.0);  // {embedding, block.0..3} and {block.4, block.5, head}
    QCOMPARE(p.chunks[1].size(), size_t(3));
  }

  void fromConfigAndBack() {
    const ModelSpec m = gptSpec(2);  // embedding, block.0, block.1, head
    ParallelConfig par;
    par.pp = 2;
    par.placement = {ChunkPlacement{0, {"embedding"}}, ChunkPlacement{1, {"block.0", "block.1", "head"}}};
    auto p = partitionFromConfig(par, m);
    QVERIFY(p.isOk());
    QCOMPARE(p->chunks[0], std::vector<int>{0});
    QCOMPARE(p->chunks[1], (std::vector<int>{1, 2, 3}));
    QCOMPARE(p->layersOfStage(1), (std::vector<int>{1, 2, 3}));
    QVERIFY(toPlacement(*p, m) == par.placement);
    par.placement.clear();
    auto even = partitionFromConfig(par, m);
    QVERIFY(even.isOk());
    QCOMPARE(even->chunks.size(), size_t(2));
    par.pp = 5;
    auto tooMany = partitionFromConfig(par, m);
    QVERIFY(!tooMany.isOk());
    QVERIFY(tooMany.message().find("/parallel/pp") != std::string::npos);
  }
};

QTEST_APPLESS_MAIN(TestPartition)
#include "tst_partition.moc"
