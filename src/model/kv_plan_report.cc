// Renderings of a KV plan: an aligned table for people, JSON for scripts, SVG for the picture
// of KV memory against context length.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/kv_plan.h"

namespace kvcache {

namespace {

std::string with_commas(double v) {
  const auto n = static_cast<long long>(std::llround(v));
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Integers stay integers in JSON; fractional per-token figures keep their fraction.
nlohmann::json number(double v) {
  if (std::fabs(v - std::round(v)) < 1e-9 && std::fabs(v) < 9e15) {
    return static_cast<int64_t>(std::llround(v));
  }
  return v;
}

std::string pad(const std::string& s, size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

// How a Gated DeltaNet layer's state comes from the config, with the numbers.
std::string linear_state_derivation(const PlanModel& m) {
  const PlanModel::LinearDims& l = *m.linear;
  int64_t layers = 0;
  for (const PlanLayer& L : m.layers)
    layers += L.kind == PlanLayerKind::kLinear || L.kind == PlanLayerKind::kHybrid;
  const int64_t recurrent = l.heads_v * l.head_dim_k * l.head_dim_v;
  const int64_t d_qkv = 2 * l.heads_k * l.head_dim_k + l.heads_v * l.head_dim_v;
  const int64_t conv = (l.conv_kernel - 1) * d_qkv;
  const double per_layer = static_cast<double>(recurrent + 2 * conv) * sizeof(float);
  std::ostringstream out;
  out << "  per linear layer: recurrent H_v*d_k*d_v = " << l.heads_v << "*" << l.head_dim_k << "*"
      << l.head_dim_v << " = " << with_commas(static_cast<double>(recurrent))
      << "\n                  + conv (k-1)*(2*H_k*d_k + H_v*d_v) = " << l.conv_kernel - 1 << "*(2*"
      << l.heads_k << "*" << l.head_dim_k << " + " << l.heads_v << "*" << l.head_dim_v
      << ") = " << with_commas(static_cast<double>(conv))
      << "\n                  + the window's copy for the conv kernel = "
      << with_commas(static_cast<double>(conv))
      << "\n                  = " << with_commas(static_cast<double>(recurrent + 2 * conv))
      << " f32 = " << with_commas(per_layer) << " B; x " << layers
      << " layers, the same at every context length\n";
  return out.str();
}

// How DeepSeek-V4's compressed layers are billed as its containers keep them, per layer type,
// with the numbers at the plan's context; then the whole bill by part.
std::string compressed_derivation(const PlanModel& m, const PlanOptions& o, const PlanResult& r) {
  std::ostringstream out;
  const int64_t S = o.context;
  const auto bytes = [](double v) { return with_commas(v) + " B"; };
  out << "compressed layers as the cache keeps them (per layer and request at S = "
      << with_commas(static_cast<double>(S)) << "; rows in " << o.format.name
      << ", buffers and overlaps in f32):\n";
  std::vector<std::string> seen;
  for (const PlanLayer& L : m.layers) {
    if (L.kind != PlanLayerKind::kCompressed) continue;
    if (std::find(seen.begin(), seen.end(), L.type) != seen.end()) continue;
    seen.push_back(L.type);
    int64_t count = 0;
    for (const PlanLayer& x : m.layers) count += x.type == L.type;
    const CompressedBill c = compressed_layer_bill(L, o, S);
    const int64_t rate = L.compress_rate, d = L.k_dim;
    // A K==V row of every KV head, and an indexer key, in the KV format.
    const std::string row = " x " + std::to_string(L.kv_heads * d) + " " + o.format.name + " (" +
                            bytes(static_cast<double>(L.kv_heads) * o.format.row_bytes(d)) + ")";
    const std::string key = " x " + std::to_string(L.index_dim) + " " + o.format.name + " (" +
                            bytes(o.format.row_bytes(L.index_dim)) + ")";
    out << "  " << L.type << " x " << count << " (rate " << rate << ", window "
        << L.compressed_window << "):\n";
    if (L.compressed_window > 0)
      out << "    K==V window   min(S, W-1) = " << with_commas(static_cast<double>(c.window_rows))
          << " rows" << row << " = " << bytes(c.window) << "\n";
    out << "    entries       S/" << rate << " = " << with_commas(static_cast<double>(c.entries))
        << row << " = " << bytes(c.entries_bytes) << "\n";
    if (L.index_dim > 0)
      out << "    indexer keys  " << with_commas(static_cast<double>(c.entries)) << key << " = "
          << bytes(c.index_keys) << "\n";
    out << "    buffers       S%" << rate << " = " << c.buffered << " rows x (kv + gate) x ("
        << L.stream_width;
    if (L.index_dim > 0) out << " + indexer " << 2 * L.index_dim;
    out << ") x 4 B = " << bytes(c.buffers) << "\n";
    if (L.overlap) {
      out << "    overlap       " << rate << " x (kv + gate) x (" << L.stream_width / 2;
      if (L.index_dim > 0) out << " + indexer " << L.index_dim;
      out << ") x 4 B = " << bytes(c.overlaps)
          << (S < rate ? " (none before the first window)" : "") << "\n";
    }
    out << "    = " << bytes(c.total()) << " per layer, x " << count << " = "
        << format_bytes(c.total() * static_cast<double>(count)) << "\n";
  }
  const CompressedBill& t = r.compressed;
  const double request = r.kv_bytes_total / static_cast<double>(o.batch);
  out << "full bill:      " << with_commas(request) << " B (" << format_bytes(request)
      << ") per request = entries " << format_bytes(t.entries_bytes) << " + indexer keys "
      << format_bytes(t.index_keys) << " + windows " << format_bytes(t.window) << " + buffers "
      << format_bytes(t.buffers) << " + overlaps " << format_bytes(t.overlaps)
      << " + sliding layers " << format_bytes(request - t.total()) << "\n";
  out << "                each further token adds " << with_commas(r.growth_bytes_per_token)
      << " B (" << format_bytes(r.growth_bytes_per_token)
      << ": entries and indexer keys; windows, buffers and overlaps stay bounded)\n";
  return out.str();
}

}  // namespace

std::string plan_table(const PlanModel& m, const PlanOptions& o, const PlanResult& r) {
  std::ostringstream out;
  out << "model: " << m.name << " (" << m.source << ")   KV dtype: " << o.format.name;
  if (o.format.group > 0) out << " (groups of " << o.format.group << ")";
  out << "   context: " << with_commas(static_cast<double>(o.context)) << "   batch: " << o.batch;
  if (o.block_tokens > 1) out << "   block: " << o.block_tokens << " tokens";
  out << "\n\n";
  out << pad("layer type", 30) << pad("layers", 7, true) << pad("bytes/token", 14, true)
      << pad("kept tokens", 13, true) << pad("state", 12, true) << pad("KV total", 14, true)
      << "\n";
  for (const PlanRow& row : r.rows) {
    std::string label = row.type;
    if (row.kind == PlanLayerKind::kShared) label += " (shared)";
    const bool per_token = row.bytes_per_token > 0;
    out << pad(label, 30) << pad(std::to_string(row.count), 7, true)
        << pad(per_token ? format_bytes(row.bytes_per_token) : "-", 14, true)
        << pad(per_token ? with_commas(static_cast<double>(row.stored_tokens)) : "-", 13, true)
        << pad(row.state_bytes > 0 ? format_bytes(row.state_bytes) : "-", 12, true)
        << pad(format_bytes(row.total_bytes), 14, true) << "\n";
  }
  out << "\nKV per token:   " << with_commas(r.kv_bytes_per_token) << " B ("
      << format_bytes(r.kv_bytes_per_token) << ", before window caps)\n";
  if (r.mha_equivalent_bytes_per_token > 0) {
    out << "MHA equivalent: " << with_commas(r.mha_equivalent_bytes_per_token) << " B ("
        << format_bytes(r.mha_equivalent_bytes_per_token) << ") per token, "
        << std::llround(r.mha_equivalent_bytes_per_token / r.kv_bytes_per_token)
        << "x more than the latent cache\n";
  }
  if (r.uncompressed_bytes_per_token > 0) {
    out << "uncompressed:   " << with_commas(r.uncompressed_bytes_per_token) << " B ("
        << format_bytes(r.uncompressed_bytes_per_token) << ") per token without compression\n"
        << "                (both per-token figures as the notes count them: compressed entries "
           "only, sliding rows uncapped)\n";
    out << compressed_derivation(m, o, r);
  }
  if (r.state_bytes_per_request > 0) {
    out << "constant state: " << with_commas(r.state_bytes_per_request) << " B ("
        << format_bytes(r.state_bytes_per_request) << ") per request\n";
    if (m.linear) out << linear_state_derivation(m);
  }
  if (r.snapshot_bytes_each > 0) {
    const int64_t every = o.snapshot_every_blocks * o.block_tokens;
    out << "prefix snapshots: " << o.max_snapshots << " x " << format_bytes(r.snapshot_bytes_each)
        << " = " << format_bytes(r.snapshot_bytes) << " per server\n"
        << "                  (paged prefix cache: the linear state every "
        << o.snapshot_every_blocks << " block" << (o.snapshot_every_blocks > 1 ? "s" : "") << " of "
        << o.block_tokens << " = " << every << " token" << (every > 1 ? "s" : "")
        << "; a hit resumes at the latest one)\n";
    if (r.kv_bytes_per_token > 0) {
      out << "                  one snapshot per " << every
          << " tokens = " << format_bytes(r.snapshot_bytes_each / static_cast<double>(every))
          << " per cached token, against " << format_bytes(r.kv_bytes_per_token)
          << " of KV per token\n";
    }
  }
  out << "KV total:       " << with_commas(r.kv_bytes_total) << " B ("
      << format_bytes(r.kv_bytes_total) << ") for " << o.batch << " x "
      << with_commas(static_cast<double>(o.context)) << " tokens\n";
  if (r.weight_bytes) {
    char gb[32];
    std::snprintf(gb, sizeof gb, "%.2f GB", *r.weight_bytes / 1e9);
    out << "weights:        " << format_bytes(*r.weight_bytes) << " = " << gb << " ("
        << (m.weight_bytes_exact
                ? "as stored"
                : "parameters x " + std::to_string(static_cast<int>(o.weight_bytes_per_param)) +
                      " B")
        << ")\n";
  }
  if (o.budget_bytes && r.weight_bytes && *r.weight_bytes >= static_cast<double>(*o.budget_bytes)) {
    out << "budget " << format_bytes(static_cast<double>(*o.budget_bytes))
        << ": the weights alone (" << format_bytes(*r.weight_bytes)
        << ") do not fit; no room for any KV cache\n";
  } else if (o.budget_bytes) {
    out << "budget " << format_bytes(static_cast<double>(*o.budget_bytes)) << ": ";
    if (!r.weight_bytes) out << "(weights unknown, not subtracted) ";
    out << *r.max_requests << " requests of " << with_commas(static_cast<double>(o.context))
        << " tokens fit; ";
    if (*r.max_context < 0) {
      out << "context unbounded for " << o.batch << " request(s) (KV stops growing)\n";
    } else {
      out << "longest context for " << o.batch
          << " request(s): " << with_commas(static_cast<double>(*r.max_context)) << " tokens";
      if (m.max_context > 0 && *r.max_context > m.max_context) {
        out << " (the model is trained for " << with_commas(static_cast<double>(m.max_context))
            << ")";
      }
      out << "\n";
    }
  }
  for (const std::string& n : m.notes) out << "note: " << n << "\n";
  return out.str();
}

std::string plan_json(const PlanModel& m, const PlanOptions& o, const PlanResult& r) {
  nlohmann::ordered_json j;
  j["model"] = m.name;
  j["source"] = m.source;
  j["kv_dtype"] = o.format.name;
  if (o.format.group > 0) j["kv_group"] = o.format.group;
  j["context"] = o.context;
  j["batch"] = o.batch;
  j["block_tokens"] = o.block_tokens;
  j["kv_bytes_per_token"] = number(r.kv_bytes_per_token);
  j["kv_bytes_total"] = number(r.kv_bytes_total);
  j["state_bytes_per_request"] = number(r.state_bytes_per_request);
  if (r.snapshot_bytes_each > 0) {
    j["snapshot_every_blocks"] = o.snapshot_every_blocks;
    j["max_snapshots"] = o.max_snapshots;
    j["snapshot_bytes_each"] = number(r.snapshot_bytes_each);
    j["snapshot_bytes"] = number(r.snapshot_bytes);
  }
  if (r.mha_equivalent_bytes_per_token > 0)
    j["mha_equivalent_bytes_per_token"] = number(r.mha_equivalent_bytes_per_token);
  if (r.uncompressed_bytes_per_token > 0) {
    j["uncompressed_bytes_per_token"] = number(r.uncompressed_bytes_per_token);
    j["growth_bytes_per_token"] = number(r.growth_bytes_per_token);
    j["compressed_bill"] = {{"entries", number(r.compressed.entries_bytes)},
                            {"indexer_keys", number(r.compressed.index_keys)},
                            {"windows", number(r.compressed.window)},
                            {"buffers", number(r.compressed.buffers)},
                            {"overlaps", number(r.compressed.overlaps)}};
  }
  j["layers"] = nlohmann::ordered_json::array();
  for (const PlanRow& row : r.rows) {
    j["layers"].push_back({{"type", row.type},
                           {"kind", plan_layer_kind_name(row.kind)},
                           {"count", row.count},
                           {"bytes_per_token", number(row.bytes_per_token)},
                           {"kept_tokens", row.stored_tokens},
                           {"state_bytes", number(row.state_bytes)},
                           {"total_bytes", number(row.total_bytes)}});
  }
  j["weight_bytes"] =
      r.weight_bytes ? nlohmann::ordered_json(number(*r.weight_bytes)) : nlohmann::ordered_json();
  if (m.max_context > 0) j["model_max_context"] = m.max_context;
  if (o.budget_bytes) {
    j["budget_bytes"] = *o.budget_bytes;
    j["max_requests"] = *r.max_requests;
    j["max_context"] = *r.max_context;  // -1: unbounded
  }
  j["notes"] = m.notes;
  return j.dump(2) + "\n";
}

std::string plan_svg(const PlanModel& m, const PlanOptions& o) {
  constexpr double kW = 720, kH = 440, kLeft = 90, kRight = 170, kTop = 40, kBottom = 60;
  const double x_min = 1024;
  const double x_max =
      std::max(x_min * 4, m.max_context > 0 ? static_cast<double>(m.max_context) : 1048576.0);
  struct Series {
    std::string label, color;
    PlanOptions opts;
  };
  std::vector<Series> series;
  series.push_back({o.format.name, "#d62728", o});
  if (o.format.name != "f16") {
    PlanOptions ref = o;
    ref.format = parse_kv_format("f16");
    series.push_back({"f16 (reference)", "#1f77b4", ref});
  }
  auto bytes_at = [&](const PlanOptions& opts, double ctx) {
    return static_cast<double>(opts.batch) *
           plan_request_bytes(m, opts, static_cast<int64_t>(std::llround(ctx)));
  };
  double y_min = 1e300, y_max = 0;
  constexpr int kPoints = 64;
  std::vector<std::vector<std::pair<double, double>>> pts(series.size());
  for (size_t s = 0; s < series.size(); ++s) {
    for (int i = 0; i <= kPoints; ++i) {
      const double ctx = x_min * std::pow(x_max / x_min, static_cast<double>(i) / kPoints);
      const double b = std::max(1.0, bytes_at(series[s].opts, ctx));
      pts[s].push_back({ctx, b});
      y_min = std::min(y_min, b);
      y_max = std::max(y_max, b);
    }
  }
  double budget_free = 0;
  if (o.budget_bytes) {
    const PlanResult r = compute_plan(m, o);
    budget_free = static_cast<double>(*o.budget_bytes) - r.weight_bytes.value_or(0.0);
    if (budget_free > 0) {
      y_min = std::min(y_min, budget_free);
      y_max = std::max(y_max, budget_free);
    }
  }
  // Round the y range out to powers of 2 so gridlines land on KiB/MiB/GiB marks.
  const double ly0 = std::floor(std::log2(y_min)),
               ly1 = std::max(ly0 + 1, std::ceil(std::log2(y_max)));
  const double lx0 = std::log2(x_min), lx1 = std::log2(x_max);
  auto X = [&](double ctx) {
    return kLeft + (std::log2(ctx) - lx0) / (lx1 - lx0) * (kW - kLeft - kRight);
  };
  auto Y = [&](double b) {
    return kH - kBottom - (std::log2(b) - ly0) / (ly1 - ly0) * (kH - kTop - kBottom);
  };

  std::ostringstream s;
  s.precision(1);
  s << std::fixed;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << kLeft << "\" y=\"22\" font-size=\"15\">KV cache of " << m.name << " ("
    << o.batch << " request" << (o.batch > 1 ? "s" : "") << ") against context length</text>\n";
  // Grid: x at powers of 4 tokens, y at every 2^k bytes step that keeps labels readable.
  for (double lx = std::ceil(lx0); lx <= lx1 + 1e-9; lx += 2) {
    const double x = X(std::exp2(lx));
    const double tokens = std::exp2(lx);
    std::string label = tokens >= 1048576
                            ? std::to_string(static_cast<long long>(tokens / 1048576)) + "M"
                            : std::to_string(static_cast<long long>(tokens / 1024)) + "K";
    s << "<line x1=\"" << x << "\" y1=\"" << kTop << "\" x2=\"" << x << "\" y2=\"" << kH - kBottom
      << "\" stroke=\"#ddd\"/>\n<text x=\"" << x << "\" y=\"" << kH - kBottom + 16
      << "\" text-anchor=\"middle\">" << label << "</text>\n";
  }
  const double ystep = std::max(1.0, std::ceil((ly1 - ly0) / 8));
  for (double ly = ly0; ly <= ly1 + 1e-9; ly += ystep) {
    const double y = Y(std::exp2(ly));
    s << "<line x1=\"" << kLeft << "\" y1=\"" << y << "\" x2=\"" << kW - kRight << "\" y2=\"" << y
      << "\" stroke=\"#ddd\"/>\n<text x=\"" << kLeft - 6 << "\" y=\"" << y + 4
      << "\" text-anchor=\"end\">" << format_bytes(std::exp2(ly)) << "</text>\n";
  }
  s << "<text x=\"" << (kLeft + kW - kRight) / 2 << "\" y=\"" << kH - 18
    << "\" text-anchor=\"middle\">context length (tokens, log scale)</text>\n";
  s << "<text transform=\"translate(18," << (kTop + kH - kBottom) / 2
    << ") rotate(-90)\" text-anchor=\"middle\">KV bytes (log scale)</text>\n";
  for (size_t i = 0; i < series.size(); ++i) {
    s << "<polyline fill=\"none\" stroke=\"" << series[i].color
      << "\" stroke-width=\"2\" points=\"";
    for (const auto& [c, b] : pts[i]) s << X(c) << "," << Y(b) << " ";
    s << "\"/>\n";
    const double ly = kTop + 20 + 20 * static_cast<double>(i);
    s << "<line x1=\"" << kW - kRight + 12 << "\" y1=\"" << ly << "\" x2=\"" << kW - kRight + 32
      << "\" y2=\"" << ly << "\" stroke=\"" << series[i].color << "\" stroke-width=\"2\"/>\n"
      << "<text x=\"" << kW - kRight + 38 << "\" y=\"" << ly + 4 << "\">" << series[i].label
      << "</text>\n";
  }
  if (budget_free > 0) {
    const double y = Y(budget_free);
    s << "<line x1=\"" << kLeft << "\" y1=\"" << y << "\" x2=\"" << kW - kRight << "\" y2=\"" << y
      << "\" stroke=\"#2ca02c\" stroke-dasharray=\"6,4\"/>\n<text x=\"" << kW - kRight + 12
      << "\" y=\"" << y + 4 << "\" fill=\"#2ca02c\">budget after weights</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace kvcache
