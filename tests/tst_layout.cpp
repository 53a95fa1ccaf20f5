// Tests of the rank layout: for every (dp, tp, pp) up to 4x4x4, coord and rank invert each other, groups
// have the right size, hold the rank, are the same list for every member and partition the world, and the
// pipeline neighbours follow stage order; a few ranks are checked against the Megatron formula by hand.
// layoutRanks() puts rank r on device r, refuses more ranks than devices unless sharing is allowed (then
// wraps), and warns about TP groups spanning nodes and about mixed device types.
#include <QtTest>

#include <algorithm>
#include <set>

#include "plan/layout.h"

namespace {

ms::Mesh meshOf(const std::vector<ms::NodeConfig>& nodes) {
  ms::MeshConfig config;
  config.nodes = nodes;
  config.intraLink = "nvlink";
  config.interLink = "infiniband";
  return *ms::buildMesh(config);
}

ms::ParallelConfig parallelOf(int dp, int tp, int pp) {
  ms::ParallelConfig p;
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  return p;
}

// "n3": appended, not "n" + s: GCC 12 gives a false -Wrestrict for the latter.
std::string nodeName(const char* prefix, int n) {
  std::string name = prefix;
  name += std::to_string(n);
  return name;
}

bool contains(const std::vector<std::string>& warnings, const std::string& substring) {
  for (const auto& w : warnings)
    if (w.find(substring) != std::string::npos) return true;
  return false;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

using GroupFn = std::vector<int> (ms::RankLayout::*)(int) const;

// Every member of each rank's group computes the same group; the groups partition [0, world).
void checkPartition(const ms::RankLayout& layout, GroupFn group, int size) {
  std::vector<int> seen(static_cast<size_t>(layout.world()), 0);
  for (int r = 0; r < layout.world(); ++r) {
    const std::vector<int> g = (layout.*group)(r);
    QCOMPARE(int(g.size()), size);
    QVERIFY(std::find(g.begin(), g.end(), r) != g.end());
    QVERIFY(std::is_sorted(g.begin(), g.end()));
    QVERIFY(std::adjacent_find(g.begin(), g.end()) == g.end());
    for (int m : g) {
      QVERIFY(m >= 0 && m < layout.world());
      QCOMPARE((layout.*group)(m), g);
    }
    if (g.front() == r)  // count each group once, from its first member
      for (int m : g) ++seen[static_cast<size_t>(m)];
  }
  for (int s : seen) QCOMPARE(s, 1);
}

}  // namespace

class TestLayout : public QObject {
  Q_OBJECT

 private slots:
  void everyShape_data() {
    QTest::addColumn<int>("dp");
    QTest::addColumn<int>("tp");
    QTest::addColumn<int>("pp");
    for (int dp = 1; dp <= 4; ++dp)
      for (int tp = 1; tp <= 4; ++tp)
        for (int pp = 1; pp <= 4; ++pp) QTest::addRow("dp%d tp%d pp%d", dp, tp, pp) << dp << tp << pp;
  }

  void everyShape() {
    QFETCH(int, dp);
    QFETCH(int, tp);
    QFETCH(int, pp);
    const ms::RankLayout layout(dp, tp, pp);
    QCOMPARE(layout.world(), dp * tp * pp);
    std::set<std::tuple<int, int, int>> coords;
    for (int r = 0; r < layout.world(); ++r) {
      const ms::RankCoord c = layout.coord(r);
      QVERIFY(c.dp >= 0 && c.dp < dp && c.tp >= 0 && c.tp < tp && c.pp >= 0 && c.pp < pp);
      QCOMPARE(layout.rank(c), r);
      QCOMPARE(r, (c.pp * dp + c.dp) * tp + c.tp);  // the Megatron order
      coords.insert({c.dp, c.tp, c.pp});
    }
    QCOMPARE(int(coords.size()), layout.world());  // coord is one-to-one

    checkPartition(layout, &ms::RankLayout::tpGroup, tp);
    checkPartition(layout, &ms::RankLayout::dpGroup, dp);
    checkPartition(layout, &ms::RankLayout::ppGroup, pp);
    for (int r = 0; r < layout.world(); ++r) {
      const ms::RankCoord c = layout.coord(r);
      const std::vector<int> tpg = layout.tpGroup(r);
      QCOMPARE(tpg.back() - tpg.front(), tp - 1);  // consecutive ranks
      for (int m : tpg) QVERIFY(layout.coord(m).dp == c.dp && layout.coord(m).pp == c.pp);
      for (int m : layout.dpGroup(r)) QVERIFY(layout.coord(m).tp == c.tp && layout.coord(m).pp == c.pp);
      const std::vector<int> ppg = layout.ppGroup(r);
      for (int s = 0; s < pp; ++s) {
        const ms::RankCoord mc = layout.coord(ppg[static_cast<size_t>(s)]);
        QVERIFY(mc.dp == c.dp && mc.tp == c.tp && mc.pp == s);  // stage order
      }
      QCOMPARE(layout.prevStageRank(r), c.pp == 0 ? -1 : ppg[static_cast<size_t>(c.pp - 1)]);
      QCOMPARE(layout.nextStageRank(r), c.pp == pp - 1 ? -1 : ppg[static_cast<size_t>(c.pp + 1)]);
      if (layout.nextStageRank(r) >= 0) QCOMPARE(layout.prevStageRank(layout.nextStageRank(r)), r);
    }
  }

  void megatronFormula_data() {
    QTest::addColumn<int>("dp");
    QTest::addColumn<int>("tp");
    QTest::addColumn<int>("pp");
    QTest::addColumn<int>("rank");
    QTest::addColumn<int>("cdp");
    QTest::addColumn<int>("ctp");
    QTest::addColumn<int>("cpp");
    QTest::newRow("2x2x2 rank 5") << 2 << 2 << 2 << 5 << 0 << 1 << 1;
    QTest::newRow("2x2x2 rank 0") << 2 << 2 << 2 << 0 << 0 << 0 << 0;
    QTest::newRow("2x2x2 rank 3") << 2 << 2 << 2 << 3 << 1 << 1 << 0;
    QTest::newRow("2x2x2 rank 6") << 2 << 2 << 2 << 6 << 1 << 0 << 1;
    QTest::newRow("2x2x2 rank 7") << 2 << 2 << 2 << 7 << 1 << 1 << 1;
    QTest::newRow("dp 4 tp 2 pp 2 rank 11") << 4 << 2 << 2 << 11 << 1 << 1 << 1;  // (1*4 + 1)*2 + 1
    QTest::newRow("dp 3 tp 4 pp 2 rank 22") << 3 << 4 << 2 << 22 << 2 << 2 << 1;  // (1*3 + 2)*4 + 2
    QTest::newRow("tp only rank 3") << 1 << 4 << 1 << 3 << 0 << 3 << 0;
    QTest::newRow("pp only rank 2") << 1 << 1 << 4 << 2 << 0 << 0 << 2;
  }

  void megatronFormula() {
    QFETCH(int, dp);
    QFETCH(int, tp);
    QFETCH(int, pp);
    QFETCH(int, rank);
    QFETCH(int, cdp);
    QFETCH(int, ctp);
    QFETCH(int, cpp);
    const ms::RankLayout layout(dp, tp, pp);
    const ms::RankCoord expected{cdp, ctp, cpp};
    QCOMPARE(layout.coord(rank), expected);
    QCOMPARE(layout.rank(expected), rank);
  }

  // Expert parallelism inside dp (dp 4 = ep 2 x edp 2, tp 2, pp 2): rank = (pp * 4 + dp) * 2 + tp. The
  // all-to-all group of a rank is its ep consecutive dp indices, its expert's replicas every ep-th one.
  void expertGroups() {
    const ms::RankLayout layout(4, 2, 2, 2);
    QCOMPARE(layout.ep(), 2);
    QCOMPARE(layout.edp(), 2);
    // rank 11: pp 1, dp 1, tp 1 -> ep rank 1, edp rank 0
    QCOMPARE(layout.epRank(layout.coord(11)), 1);
    QCOMPARE(layout.edpRank(layout.coord(11)), 0);
    QCOMPARE(layout.epGroup(11), (std::vector<int>{9, 11}));    // dp 0, 1
    QCOMPARE(layout.edpGroup(11), (std::vector<int>{11, 15}));  // dp 1, 3
    QCOMPARE(layout.epGroup(13), (std::vector<int>{13, 15}));   // dp 2, 3
    QCOMPARE(layout.edpGroup(12), (std::vector<int>{8, 12}));   // dp 0, 2, tp 0
    checkPartition(layout, &ms::RankLayout::epGroup, 2);
    checkPartition(layout, &ms::RankLayout::edpGroup, 2);
    // ep = dp: one all-to-all group per (tp, pp), every expert once.
    const ms::RankLayout all(4, 1, 1, 4);
    QCOMPARE(all.epGroup(2), (std::vector<int>{0, 1, 2, 3}));
    QCOMPARE(all.edpGroup(2), (std::vector<int>{2}));
  }

  // Five dimensions, Megatron-Core's order tp-cp-ep-dp-pp: rank = ((pp * dp + dp_i) * cp + cp_i) * tp + tp_i.
  void contextParallelGroups() {
    const ms::RankLayout layout(2, 2, 2, 1, 3);  // dp 2, tp 2, pp 2, cp 3: 24 ranks
    QCOMPARE(layout.world(), 24);
    // rank 17 = ((1 * 2 + 0) * 3 + 2) * 2 + 1: pp 1, dp 0, cp 2, tp 1
    const ms::RankCoord c = layout.coord(17);
    QCOMPARE(c, (ms::RankCoord{0, 1, 1, 2}));
    QCOMPARE(layout.rank(c), 17);
    QCOMPARE(layout.dpCpRank(c), 2);
    QCOMPARE(layout.tpGroup(17), (std::vector<int>{16, 17}));
    QCOMPARE(layout.cpGroup(17), (std::vector<int>{13, 15, 17}));  // cp 0, 1, 2: stride tp
    QCOMPARE(layout.dpGroup(17), (std::vector<int>{17, 23}));      // dp 0, 1: stride cp * tp
    QCOMPARE(layout.dpCpGroup(17), (std::vector<int>{13, 15, 17, 19, 21, 23}));
    QCOMPARE(layout.ppGroup(17), (std::vector<int>{5, 17}));
    for (int r = 0; r < layout.world(); ++r) QCOMPARE(layout.rank(layout.coord(r)), r);
    checkPartition(layout, &ms::RankLayout::cpGroup, 3);
    checkPartition(layout, &ms::RankLayout::dpCpGroup, 6);
    checkPartition(layout, &ms::RankLayout::dpGroup, 2);
    checkPartition(layout, &ms::RankLayout::tpGroup, 2);
    checkPartition(layout, &ms::RankLayout::ppGroup, 2);
    // The layout of a config: cp multiplies the ranks, and a cp group of 4 with tp 2 spans 8 devices, so on
    // 8-device nodes it stays inside one node.
    ms::ParallelConfig p;
    p.dp = 2;
    p.tp = 2;
    p.cp = 4;
    const ms::Mesh mesh = meshOf({{"node0", "h100-sxm-80gb", 8}, {"node1", "h100-sxm-80gb", 8}});
    auto laid = ms::layoutRanks(p, mesh);
    QVERIFY2(laid.isOk(), laid.message().c_str());
    QCOMPARE(laid->layout.world(), 16);
    QCOMPARE(laid->layout.cpGroup(1), (std::vector<int>{1, 3, 5, 7}));
    // Expert parallelism is carved out of the dp x cp ranks (index dp * cp + cp_i): with dp 2, cp 2, ep 4 the
    // all-to-all group is every replica and slice of a (tp, pp) position; with ep 2 it is a replica's ring.
    const ms::RankLayout moe(2, 2, 1, 4, 2);  // 8 ranks: rank = (dp * 2 + cp) * 2 + tp
    QCOMPARE(moe.epGroup(3), (std::vector<int>{1, 3, 5, 7}));
    QCOMPARE(moe.epRank(moe.coord(3)), 1);
    QCOMPARE(moe.edpGroup(3), (std::vector<int>{3}));
    const ms::RankLayout moe2(2, 2, 1, 2, 2);
    QCOMPARE(moe2.edp(), 2);
    QCOMPARE(moe2.epGroup(6), (std::vector<int>{4, 6}));   // dp 1: its cp 0 and cp 1
    QCOMPARE(moe2.edpGroup(6), (std::vector<int>{2, 6}));  // cp 1 of dp 0 and of dp 1
    checkPartition(moe2, &ms::RankLayout::epGroup, 2);
    checkPartition(moe2, &ms::RankLayout::edpGroup, 2);
    p.cp = 8;
    auto tooMany = ms::layoutRanks(p, mesh);
    QVERIFY(!tooMany.isOk());
    QVERIFY2(tooMany.message().find("dp*cp*tp*pp = 32 ranks need 32 devices") != std::string::npos,
             tooMany.message().c_str());
  }

  void groupsOf2x2x2() {
    const ms::RankLayout layout(2, 2, 2);
    QCOMPARE(layout.tpGroup(5), (std::vector<int>{4, 5}));
    QCOMPARE(layout.dpGroup(5), (std::vector<int>{5, 7}));
    QCOMPARE(layout.ppGroup(5), (std::vector<int>{1, 5}));
    QCOMPARE(layout.prevStageRank(5), 1);
    QCOMPARE(layout.nextStageRank(5), -1);
    QCOMPARE(layout.prevStageRank(2), -1);
    QCOMPARE(layout.nextStageRank(2), 6);
  }

  void defaultLayoutIsOneRank() {
    const ms::RankLayout layout;
    QCOMPARE(layout.world(), 1);
    QCOMPARE(layout.tpGroup(0), std::vector<int>{0});
    QCOMPARE(layout.prevStageRank(0), -1);
    QCOMPARE(layout.nextStageRank(0), -1);
  }

  // Rank r on device r; with tp dividing the devices per node every TP group stays inside one node.
  void tpGroupsStayInNodes_data() {
    QTest::addColumn<int>("dp");
    QTest::addColumn<int>("tp");
    QTest::addColumn<int>("pp");
    QTest::addColumn<int>("nodes");
    QTest::addColumn<int>("perNode");
    QTest::newRow("2 nodes of 8, tp 8") << 1 << 8 << 2 << 2 << 8;
    QTest::newRow("2 nodes of 8, tp 4 dp 2 pp 2") << 2 << 4 << 2 << 2 << 8;
    QTest::newRow("4 nodes of 4, tp 2 dp 4 pp 2") << 4 << 2 << 2 << 4 << 4;
    QTest::newRow("4 nodes of 4, fewer ranks") << 2 << 2 << 2 << 4 << 4;
    QTest::newRow("1 node of 8, tp 4") << 2 << 4 << 1 << 1 << 8;
  }

  void tpGroupsStayInNodes() {
    QFETCH(int, dp);
    QFETCH(int, tp);
    QFETCH(int, pp);
    QFETCH(int, nodes);
    QFETCH(int, perNode);
    std::vector<ms::NodeConfig> config;
    for (int n = 0; n < nodes; ++n) config.push_back({nodeName("node", n), "h100-sxm-80gb", perNode});
    const ms::Mesh mesh = meshOf(config);
    const auto result = ms::layoutRanks(parallelOf(dp, tp, pp), mesh);
    QVERIFY2(result.isOk(), result.message().c_str());
    const ms::RankLayout& layout = result->layout;
    QCOMPARE(int(layout.deviceOf.size()), layout.world());
    for (int r = 0; r < layout.world(); ++r) QCOMPARE(layout.deviceOf[static_cast<size_t>(r)], r);
    for (int r = 0; r < layout.world(); ++r)
      for (int m : layout.tpGroup(r))
        QCOMPARE(mesh.devices[static_cast<size_t>(layout.deviceOf[static_cast<size_t>(m)])].node,
                 mesh.devices[static_cast<size_t>(layout.deviceOf[static_cast<size_t>(r)])].node);
    QVERIFY2(result->warnings.empty(), joined(result->warnings).c_str());
  }

  void tooManyRanks() {
    const ms::Mesh mesh = meshOf({{"a", "h100-sxm-80gb", 4}, {"b", "h100-sxm-80gb", 4}});
    const auto result = ms::layoutRanks(parallelOf(2, 4, 2), mesh);
    QVERIFY(!result.isOk());
    QCOMPARE(result.message(), std::string("/parallel: dp*tp*pp = 16 ranks need 16 devices; the mesh has 8"));
  }

  void badDegrees() {
    const ms::Mesh mesh = meshOf({{"a", "cpu", 4}});
    const auto result = ms::layoutRanks(parallelOf(1, 0, 1), mesh);
    QVERIFY(!result.isOk());
    QCOMPARE(result.message(), std::string("/parallel/tp: must be >= 1, got 0"));
    QVERIFY(!ms::layoutRanks(parallelOf(1, 1, 1), ms::Mesh{}).isOk());
  }

  void sharingWraps() {
    const ms::Mesh mesh = meshOf({{"host", "cpu", 3}});
    const auto result = ms::layoutRanks(parallelOf(2, 2, 2), mesh, /*allowSharing=*/true);
    QVERIFY2(result.isOk(), result.message().c_str());
    const std::vector<int> expected = {0, 1, 2, 0, 1, 2, 0, 1};
    QCOMPARE(result->layout.deviceOf, expected);
    QVERIFY2(contains(result->warnings, "8 ranks share 3 devices (up to 3 per device)"),
             joined(result->warnings).c_str());
    // Sharing allowed but not needed: one rank per device, no warning.
    const auto fits = ms::layoutRanks(parallelOf(1, 1, 3), mesh, true);
    QVERIFY(fits.isOk());
    QCOMPARE(fits->layout.deviceOf, (std::vector<int>{0, 1, 2}));
    QVERIFY(fits->warnings.empty());
  }

  void tpGroupSpansNodes_data() {
    QTest::addColumn<int>("tp");
    QTest::addColumn<int>("dp");
    QTest::addColumn<QString>("perNode");  // device counts, comma-separated
    QTest::addColumn<QString>("warning");
    QTest::addColumn<QString>("reason");
    QTest::newRow("tp 3 on nodes of 4") << 3 << 2 << "4,4"
                                        << "TP group 1 (ranks 3..5) spans nodes n0 and n1"
                                        << "tp (3) does not divide the 4 devices per node";
    QTest::newRow("tp 4 on nodes of 2") << 4 << 1 << "2,2"
                                        << "TP group 0 (ranks 0..3) spans nodes n0 and n1"
                                        << "does not divide the 2 devices";
    QTest::newRow("tp 4 over three nodes") << 4 << 1 << "1,2,1"
                                           << "TP group 0 (ranks 0..3) spans nodes n0, n1 and n2"
                                           << "the nodes have different device counts";
    QTest::newRow("uneven nodes") << 2 << 2 << "3,1"
                                  << "TP group 1 (ranks 2..3) spans nodes n0 and n1"
                                  << "the nodes have different device counts";
  }

  void tpGroupSpansNodes() {
    QFETCH(int, tp);
    QFETCH(int, dp);
    QFETCH(QString, perNode);
    QFETCH(QString, warning);
    QFETCH(QString, reason);
    std::vector<ms::NodeConfig> config;
    const QStringList counts = perNode.split(',');
    for (int n = 0; n < counts.size(); ++n)
      config.push_back({nodeName("n", n), "a100-80gb", counts[n].toInt()});
    const ms::Mesh mesh = meshOf(config);
    const auto result = ms::layoutRanks(parallelOf(dp, tp, 1), mesh);
    QVERIFY2(result.isOk(), result.message().c_str());
    QVERIFY2(contains(result->warnings, warning.toStdString()), joined(result->warnings).c_str());
    QVERIFY2(contains(result->warnings, reason.toStdString()), joined(result->warnings).c_str());
    QVERIFY2(contains(result->warnings, "(infiniband)"), joined(result->warnings).c_str());
  }

  void manySpanningGroupsAreCounted() {
    std::vector<ms::NodeConfig> config;
    for (int n = 0; n < 16; ++n) config.push_back({nodeName("n", n), "cpu", 3});
    const auto result = ms::layoutRanks(parallelOf(24, 2, 1), meshOf(config));  // 48 ranks on 48 devices
    QVERIFY2(result.isOk(), result.message().c_str());
    // Groups 1, 4, 7, ..., 22 (ranks 2..3, 8..9, ...) cross nodes; four are listed, the other four counted.
    QVERIFY(contains(result->warnings, "TP group 1 (ranks 2..3) spans nodes n0 and n1"));
    QVERIFY(contains(result->warnings, "TP group 10 (ranks 20..21) spans nodes n6 and n7"));
    QVERIFY(!contains(result->warnings, "TP group 13"));
    QVERIFY2(contains(result->warnings, "... and 4 more TP groups span nodes"),
             joined(result->warnings).c_str());
    QCOMPARE(result->warnings.size(), size_t(6));
  }

  void mixedDeviceTypes() {
    const ms::Mesh mesh = meshOf({{"a", "h100-sxm-80gb", 2}, {"b", "a100-80gb", 2}});
    const auto all = ms::layoutRanks(parallelOf(2, 2, 1), mesh);
    QVERIFY2(all.isOk(), all.message().c_str());
    QVERIFY2(
        contains(all->warnings,
                 "ranks run on different device types (h100-sxm-80gb, a100-80gb): the slowest sets the pace"),
        joined(all->warnings).c_str());
    // Only the devices that hold ranks count.
    const auto firstNode = ms::layoutRanks(parallelOf(1, 2, 1), mesh);
    QVERIFY(firstNode.isOk());
    QVERIFY2(firstNode->warnings.empty(), joined(firstNode->warnings).c_str());
  }
};

QTEST_APPLESS_MAIN(TestLayout)

#include "tst_layout.moc"
