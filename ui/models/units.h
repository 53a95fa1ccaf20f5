// One convention for every figure the studio shows, so a number read in one view means the same in another:
// memory in binary units (KiB, MiB, GiB, TiB: steps of 1024, what allocators, the engine's memory lines and
// nvidia-smi count), always with the unit in the text or in the label that heads the numbers; rates and
// counts with SI prefixes (k, M, G: steps of 1000, as throughput is quoted); durations in s, ms or µs; link
// bandwidth in GB/s (10^9 bytes per second, as link datasheets quote it).
//
// What always holds: no function here returns a memory figure in decimal GB or MB; formatBytes(x) ends in one
// of the names byteUnitFor() can return; a non-finite or negative input gives "–" (nothing known), never
// "nan" or "inf".
#pragma once

#include <QString>

namespace ms {

struct ByteUnit {
  QString name;  // "KiB", "MiB", "GiB" or "TiB"
  double bytes;  // bytes in one of it
};

// The unit for figures up to `largestBytes`: the largest whose value stays at least 1 (KiB at the least).
ByteUnit byteUnitFor(double largestBytes);
// "24.0 GiB", "25.3 MiB", "512 KiB": three significant digits in the unit byteUnitFor(bytes) picks.
QString formatBytes(double bytes);
// The value alone in a given unit with fixed decimals ("12.50"), for tables and axes whose label names it.
QString formatBytesIn(double bytes, const ByteUnit& unit, int decimals = 2);
// "234 k", "2.93 M", "812": three significant digits with an SI prefix (k, M, G, T, P), for counts and rates.
QString formatSi(double value);
// "13.4 s", "212 ms", "35.0 µs".
QString formatSeconds(double seconds);
// "24.6%" (a fraction in, one decimal by default).
QString formatPercent(double fraction, int decimals = 1);

}  // namespace ms
