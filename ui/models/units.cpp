// Units; see units.h.
#include "ui/models/units.h"

#include <cmath>

namespace ms {

namespace {

const QString kUnknown = QStringLiteral("–");

bool known(double v) {
  return std::isfinite(v) && v >= 0;
}

// Three significant digits: 1.23, 12.3, 123.
QString threeDigits(double v) {
  const int decimals = v >= 99.95 ? 0 : v >= 9.995 ? 1 : 2;
  return QString::number(v, 'f', decimals);
}

}  // namespace

ByteUnit byteUnitFor(double largestBytes) {
  static const char* names[] = {"KiB", "MiB", "GiB", "TiB"};
  double bytes = 1024.0;
  int i = 0;
  while (i < 3 && std::isfinite(largestBytes) && largestBytes >= bytes * 1024.0) {
    bytes *= 1024.0;
    ++i;
  }
  return {QString::fromLatin1(names[i]), bytes};
}

QString formatBytes(double bytes) {
  if (!known(bytes)) return kUnknown;
  const ByteUnit unit = byteUnitFor(bytes);
  double v = bytes / unit.bytes;
  // 1023.9 MiB rounds to "1024 MiB": say 1.00 GiB instead.
  if (v >= 1023.5 && unit.name != QLatin1String("TiB")) return formatBytes(1024.0 * unit.bytes);
  return threeDigits(v) + QLatin1Char(' ') + unit.name;
}

QString formatBytesIn(double bytes, const ByteUnit& unit, int decimals) {
  if (!known(bytes) || unit.bytes <= 0) return kUnknown;
  return QString::number(bytes / unit.bytes, 'f', decimals);
}

QString formatSi(double value) {
  if (!std::isfinite(value)) return kUnknown;
  static const char* prefixes[] = {"", " k", " M", " G", " T", " P"};
  double v = std::abs(value);
  int i = 0;
  while (v >= 999.5 && i < 5) {
    v /= 1000.0;
    ++i;
  }
  return (value < 0 ? QStringLiteral("-") : QString()) +
         (i == 0 && v == std::floor(v) ? QString::number(v, 'f', 0) : threeDigits(v)) +
         QString::fromLatin1(prefixes[i]);
}

QString formatSeconds(double s) {
  if (!known(s)) return kUnknown;
  if (s >= 0.9995) return threeDigits(s) + QStringLiteral(" s");
  if (s >= 0.9995e-3) return threeDigits(s * 1e3) + QStringLiteral(" ms");
  return threeDigits(s * 1e6) + QStringLiteral(" µs");
}

QString formatPercent(double fraction, int decimals) {
  if (!std::isfinite(fraction)) return kUnknown;
  return QString::number(100.0 * fraction, 'f', decimals) + QLatin1Char('%');
}

}  // namespace ms
