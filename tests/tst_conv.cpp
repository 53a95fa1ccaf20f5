// The CPU convolution and batch-norm kernels (kernels/cpu/conv.cpp) against direct references computed here
// in double from their definitions: a convolution as its sum over channels and kernel offsets, batch norm as
// algorithm 1 of Ioffe and Szegedy 2015 with its gradient. Shapes with padding, strides, odd sizes and a
// kernel larger than the stride; every backward checked to accumulate into what its buffers held.
#include <QtTest/QtTest>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace {

using Vec = std::vector<float>;
using ms::cpu::Conv2dShape;

Vec rnd(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double maxRel(const Vec& got, const std::vector<double>& want) {
  double worst = 0, scale = 1e-6;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]) / scale);
  return worst;
}

// x[b][c][h][w] with zero outside the image.
double at(const Vec& x, const Conv2dShape& s, int b, int c, int h, int w) {
  if (h < 0 || h >= s.H || w < 0 || w >= s.W) return 0.0;
  return x[((size_t(b) * s.C + c) * s.H + h) * s.W + w];
}

}  // namespace

class TestConv : public QObject {
  Q_OBJECT

 private slots:
  void conv_data() {
    QTest::addColumn<int>("B");
    QTest::addColumn<int>("C");
    QTest::addColumn<int>("H");
    QTest::addColumn<int>("W");
    QTest::addColumn<int>("OC");
    QTest::addColumn<int>("K");
    QTest::addColumn<int>("stride");
    QTest::addColumn<int>("pad");
    QTest::addRow("1x1") << 2 << 3 << 5 << 4 << 4 << 1 << 1 << 0;
    QTest::addRow("3x3 pad 1") << 2 << 3 << 7 << 6 << 5 << 3 << 1 << 1;
    QTest::addRow("3x3 stride 2 pad 1") << 3 << 4 << 9 << 8 << 6 << 3 << 2 << 1;
    QTest::addRow("5x5 stride 2, no pad") << 1 << 2 << 11 << 13 << 3 << 5 << 2 << 0;
    QTest::addRow("7x7 stride 2 pad 3 (ResNet stem)") << 2 << 1 << 28 << 28 << 8 << 7 << 2 << 3;
  }

  void conv() {
    QFETCH(int, B);
    QFETCH(int, C);
    QFETCH(int, H);
    QFETCH(int, W);
    QFETCH(int, OC);
    QFETCH(int, K);
    QFETCH(int, stride);
    QFETCH(int, pad);
    const Conv2dShape s{B, C, H, W, OC, K, K, stride, pad};
    const int OH = s.outH(), OW = s.outW();
    QCOMPARE(OH, (H + 2 * pad - K) / stride + 1);
    std::mt19937 rng(7);
    const Vec x = rnd(rng, size_t(B) * C * H * W), w = rnd(rng, size_t(OC) * C * K * K), bias = rnd(rng, OC);
    const Vec dout = rnd(rng, size_t(B) * OC * OH * OW);
    // Direct references.
    std::vector<double> out(dout.size()), dx(x.size()), dw(w.size()), db(OC);
    for (int b = 0; b < B; ++b)
      for (int o = 0; o < OC; ++o)
        for (int oh = 0; oh < OH; ++oh)
          for (int ow = 0; ow < OW; ++ow) {
            const size_t oi = ((size_t(b) * OC + o) * OH + oh) * OW + ow;
            double sum = bias[o];
            for (int c = 0; c < C; ++c)
              for (int kh = 0; kh < K; ++kh)
                for (int kw = 0; kw < K; ++kw) {
                  const int h = oh * stride - pad + kh, ww = ow * stride - pad + kw;
                  const size_t wi = ((size_t(o) * C + c) * K + kh) * K + kw;
                  sum += double(w[wi]) * at(x, s, b, c, h, ww);
                  dw[wi] += double(dout[oi]) * at(x, s, b, c, h, ww);
                  if (h >= 0 && h < H && ww >= 0 && ww < W)
                    dx[((size_t(b) * C + c) * H + h) * W + ww] += double(dout[oi]) * w[wi];
                }
            out[oi] = sum;
            db[o] += dout[oi];
          }
    Vec got(out.size(), 7.0f);
    ms::cpu::conv2dForward(got.data(), x.data(), w.data(), bias.data(), s);
    QVERIFY2(maxRel(got, out) < 1e-5, qPrintable(QString::number(maxRel(got, out))));
    // Backward accumulates: start every gradient at 1 and compare against 1 + reference.
    Vec gx(x.size(), 1.0f), gw(w.size(), 1.0f), gb(OC, 1.0f);
    ms::cpu::conv2dBackward(gx.data(), gw.data(), gb.data(), dout.data(), x.data(), w.data(), s);
    for (auto* v : {&dx, &dw, &db})
      for (double& e : *v) e += 1.0;
    QVERIFY2(maxRel(gx, dx) < 1e-5, qPrintable(QString::number(maxRel(gx, dx))));
    QVERIFY2(maxRel(gw, dw) < 1e-5, qPrintable(QString::number(maxRel(gw, dw))));
    QVERIFY2(maxRel(gb, db) < 1e-5, qPrintable(QString::number(maxRel(gb, db))));
    // Without a bias, and gradients skipped where null.
    ms::cpu::conv2dForward(got.data(), x.data(), w.data(), nullptr, s);
    for (size_t i = 0; i < out.size(); ++i) out[i] -= bias[((i / (size_t(OH) * OW)) % OC)];
    QVERIFY(maxRel(got, out) < 1e-5);
    Vec gx2(x.size(), 0.0f);
    ms::cpu::conv2dBackward(gx2.data(), nullptr, nullptr, dout.data(), x.data(), w.data(), s);
    for (double& e : dx) e -= 1.0;
    QVERIFY(maxRel(gx2, dx) < 1e-5);
  }

  // Training-mode batch norm in parts (the split synchronised batch norm all-reduces between): forward,
  // running statistics and backward against algorithm 1 and its gradient in double; and two halves of a
  // batch whose sums are added (what an all-reduce over 2 ranks gives) equal the whole batch.
  void batchNorm() {
    const int B = 6, C = 5, S = 7;
    const double n = double(B) * S;
    std::mt19937 rng(11);
    const Vec x = rnd(rng, size_t(B) * C * S, -2.0f, 3.0f), gamma = rnd(rng, C, 0.5f, 1.5f),
              beta = rnd(rng, C), dout = rnd(rng, x.size());
    const float eps = 1e-5f, momentum = 0.1f;
    std::vector<double> mean(C, 0), var(C, 0), out(x.size()), dx(x.size()), dg(C, 0), dbeta(C, 0);
    auto idx = [&](int b, int c, int i) { return (size_t(b) * C + c) * S + i; };
    for (int c = 0; c < C; ++c) {
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < S; ++i) mean[c] += x[idx(b, c, i)] / n;
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < S; ++i) var[c] += (x[idx(b, c, i)] - mean[c]) * (x[idx(b, c, i)] - mean[c]) / n;
      const double r = 1.0 / std::sqrt(var[c] + eps);
      double sdy = 0, sdyx = 0;
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < S; ++i) {
          const double xh = (x[idx(b, c, i)] - mean[c]) * r;
          out[idx(b, c, i)] = xh * gamma[c] + beta[c];
          sdy += dout[idx(b, c, i)];
          sdyx += dout[idx(b, c, i)] * xh;
        }
      dg[c] = sdyx;
      dbeta[c] = sdy;
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < S; ++i) {
          const double xh = (x[idx(b, c, i)] - mean[c]) * r;
          dx[idx(b, c, i)] = gamma[c] * r / n * (n * dout[idx(b, c, i)] - sdy - xh * sdyx);
        }
    }
    std::vector<double> sum(C), sumSq(C), bvar(C), sdy(C), sdyx(C);
    Vec m(C), rstd(C), got(x.size());
    ms::cpu::batchNormStats(sum.data(), sumSq.data(), x.data(), B, C, S);
    ms::cpu::batchNormMoments(m.data(), rstd.data(), bvar.data(), sum.data(), sumSq.data(), n, C, eps);
    ms::cpu::batchNormApply(got.data(), x.data(), m.data(), rstd.data(), gamma.data(), beta.data(), B, C, S);
    QVERIFY2(maxRel(got, out) < 1e-5, qPrintable(QString::number(maxRel(got, out))));
    Vec runMean(C, 0.0f), runVar(C, 1.0f);
    ms::cpu::batchNormUpdateRunning(runMean.data(), runVar.data(), m.data(), bvar.data(), n, C, momentum);
    for (int c = 0; c < C; ++c) {
      QVERIFY(std::fabs(runMean[c] - 0.1 * mean[c]) < 1e-6);
      QVERIFY(std::fabs(runVar[c] - (0.9 + 0.1 * var[c] * n / (n - 1))) < 1e-5);  // unbiased, as PyTorch
    }
    ms::cpu::batchNormGradStats(sdy.data(), sdyx.data(), dout.data(), x.data(), m.data(), rstd.data(), B, C,
                                S);
    Vec gx(x.size(), 0.0f), gg(C, 0.0f), gb(C, 0.0f);
    ms::cpu::batchNormBackwardApply(gx.data(), gg.data(), gb.data(), dout.data(), x.data(), m.data(),
                                    rstd.data(), gamma.data(), sdy.data(), sdyx.data(), sdy.data(),
                                    sdyx.data(), n, B, C, S);
    QVERIFY2(maxRel(gx, dx) < 1e-5, qPrintable(QString::number(maxRel(gx, dx))));
    QVERIFY(maxRel(gg, dg) < 1e-5);
    QVERIFY(maxRel(gb, dbeta) < 1e-5);

    // Two halves of the batch (3 samples each), their sums added: the whole batch's statistics and input
    // gradient, each half's own part of it.
    const int half = B / 2;
    const size_t hn = size_t(half) * C * S;
    std::vector<double> s1(C), q1(C), s2(C), q2(C), d1(C), e1(C), d2(C), e2(C);
    ms::cpu::batchNormStats(s1.data(), q1.data(), x.data(), half, C, S);
    ms::cpu::batchNormStats(s2.data(), q2.data(), x.data() + hn, half, C, S);
    for (int c = 0; c < C; ++c) {
      QVERIFY(std::fabs(s1[c] + s2[c] - sum[c]) < 1e-9 * std::max(1.0, std::fabs(sum[c])));
      s1[c] += s2[c];
      q1[c] += q2[c];
    }
    Vec hm(C), hr(C), hx(x.size(), 0.0f), hg(C, 0.0f), hb(C, 0.0f);
    ms::cpu::batchNormMoments(hm.data(), hr.data(), nullptr, s1.data(), q1.data(), n, C, eps);
    ms::cpu::batchNormGradStats(d1.data(), e1.data(), dout.data(), x.data(), hm.data(), hr.data(), half, C,
                                S);
    ms::cpu::batchNormGradStats(d2.data(), e2.data(), dout.data() + hn, x.data() + hn, hm.data(), hr.data(),
                                half, C, S);
    std::vector<double> dsum(C), esum(C);
    for (int c = 0; c < C; ++c) dsum[c] = d1[c] + d2[c], esum[c] = e1[c] + e2[c];
    ms::cpu::batchNormBackwardApply(hx.data(), hg.data(), hb.data(), dout.data(), x.data(), hm.data(),
                                    hr.data(), gamma.data(), dsum.data(), esum.data(), d1.data(), e1.data(),
                                    n, half, C, S);
    ms::cpu::batchNormBackwardApply(hx.data() + hn, hg.data(), hb.data(), dout.data() + hn, x.data() + hn,
                                    hm.data(), hr.data(), gamma.data(), dsum.data(), esum.data(), d2.data(),
                                    e2.data(), n, half, C, S);
    QVERIFY2(maxRel(hx, dx) < 1e-5, qPrintable(QString::number(maxRel(hx, dx))));
    QVERIFY(maxRel(hg, dg) < 1e-5);
    QVERIFY(maxRel(hb, dbeta) < 1e-5);
  }
};

QTEST_APPLESS_MAIN(TestConv)
#include "tst_conv.moc"
