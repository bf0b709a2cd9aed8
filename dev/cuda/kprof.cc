/* Kernel times under CUDA-graph replay, for a GPU machine without nsys: a CUPTI injection library.
 *
 *   CUDA_INJECTION64_PATH=$BIN/libg3kprof.so G3_KPROF_OUT=kprof.txt $BIN/g3cuda_bench ...
 *
 * The CUDA driver loads this library at the first CUDA call and calls InitializeInjection(); it turns on CUPTI's
 * concurrent-kernel activity records (start and end of every kernel on the GPU clock, with the graph and the launch
 * it belongs to) and, at process exit, writes for every graph replayed at least 4 times:
 *   - a header: kernels per replay, replays, mean span of a replay (first kernel start to last kernel end) and the
 *     mean sum of kernel durations (span - sum: time the GPU spent between kernels of the graph);
 *   - per kernel position in the replay (launch order on the GPU): the kernel's demangled name, grid, dynamic shared
 *     memory, mean duration and mean gap after the previous kernel's end (negative: overlapped, e.g. programmatic
 *     dependent launch), over the replays after the first;
 *   - the same folded by the layer period when the sequence repeats (middle layers, mean per position).
 * Eager kernels (outside graphs) are summed per name. Timing with CUPTI on costs a little per kernel; compare spans,
 * not absolute tokens/s, with runs without it. */
#include <cupti.h>
#include <cxxabi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace {

struct krec {
    uint64_t start, end, node;
    uint32_t graph, corr, name, gx, smem;
};

std::vector<krec> recs;
std::vector<std::string> names;
std::map<std::string, uint32_t> name_ix;

uint32_t intern(const char *mangled) {
    std::string s = mangled ? mangled : "?";
    auto it = name_ix.find(s);
    if (it != name_ix.end()) return it->second;
    int st = 0;
    char *d = abi::__cxa_demangle(s.c_str(), NULL, NULL, &st);
    std::string shown = st == 0 && d ? d : s;
    free(d);
    size_t par = shown.find('(');
    if (par != std::string::npos) shown.resize(par); /* drop the parameter list: the template arguments say enough */
    if (shown.size() > 90) shown.resize(90);
    names.push_back(shown);
    return name_ix[s] = (uint32_t)(names.size() - 1);
}

void CUPTIAPI buf_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = 8 << 20;
    *buf = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;
}

void CUPTIAPI buf_completed(CUcontext, uint32_t, uint8_t *buf, size_t, size_t valid) {
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        recs.push_back({k->start, k->end, k->graphNodeId, k->graphId, k->correlationId, intern(k->name),
                        (uint32_t)k->gridX, (uint32_t)k->dynamicSharedMemory});
    }
    free(buf);
}

/* smallest period p (kernels per layer) with names[i] == names[i + p] over the middle half of a replay */
int layer_period(const std::vector<uint32_t> &seq) {
    const int n = (int)seq.size();
    for (int p = 2; p <= n / 4; p++) {
        int ok = 1;
        for (int i = n / 4; i + p < 3 * n / 4 && ok; i++) ok = seq[i] == seq[i + p];
        if (ok) return p;
    }
    return 0;
}

void report(void) {
    cuptiActivityFlushAll(1);
    const char *path = getenv("G3_KPROF_OUT");
    FILE *f = path && *path ? fopen(path, "w") : stderr;
    if (!f) f = stderr;
    std::map<uint32_t, std::map<uint32_t, std::vector<const krec *>>> by_graph; /* graph -> launch -> kernels */
    std::map<uint32_t, std::pair<double, int>> eager;
    for (const krec &k : recs) {
        if (k.graph) by_graph[k.graph][k.corr].push_back(&k);
        else eager[k.name].first += (k.end - k.start) * 1e-3, eager[k.name].second++;
    }
    for (auto &g : by_graph) {
        std::vector<std::vector<const krec *>> launches;
        auto earlier = [](const krec *a, const krec *b) { return a->start < b->start; };
        for (auto &l : g.second) {
            std::sort(l.second.begin(), l.second.end(), earlier);
            launches.push_back(l.second);
        }
        if (launches.size() < 4) continue;
        std::sort(launches.begin(), launches.end(),
                  [&](const std::vector<const krec *> &a, const std::vector<const krec *> &b) {
                      return earlier(a[0], b[0]);
                  });
        const size_t nk = launches[0].size();
        std::vector<double> dur(nk, 0), gap(nk, 0);
        double span = 0;
        int used = 0;
        for (size_t l = 1; l < launches.size(); l++) { /* the first replay may include one-time work */
            const auto &v = launches[l];
            if (v.size() != nk) continue;
            used++;
            span += (v[nk - 1]->end - v[0]->start) * 1e-3;
            for (size_t i = 0; i < nk; i++) {
                dur[i] += (v[i]->end - v[i]->start) * 1e-3;
                if (i) gap[i] += ((double)v[i]->start - (double)v[i - 1]->end) * 1e-3;
            }
        }
        if (!used) continue;
        double busy = 0;
        for (double d : dur) busy += d;
        fprintf(f, "graph %u: %zu kernels, %d replays used of %zu; mean span %.1f us, sum of kernels %.1f us\n",
                g.first, nk, used, launches.size(), span / used, busy / used);
        std::vector<uint32_t> seq;
        for (const krec *k : launches[1]) seq.push_back(k->name);
        for (size_t i = 0; i < nk; i++) {
            const krec *k = launches[1][i];
            fprintf(f, "  %4zu %9.2f us  gap %7.2f  grid %6u smem %6u  %s\n", i, dur[i] / used, gap[i] / used, k->gx,
                    k->smem, names[k->name].c_str());
        }
        const int p = layer_period(seq);
        if (p) { /* fold the middle layers: mean per position in the layer */
            const size_t a = (nk / 4 / p + 1) * p, b = (3 * nk / 4 / p) * p;
            fprintf(f, " folded by layer (%d kernels per layer), layers %zu..%zu:\n", p, a / p, b / p);
            double tot = 0, totg = 0;
            for (int j = 0; j < p; j++) {
                double d = 0, gg = 0;
                int c = 0;
                for (size_t i = a + j; i < b; i += p) d += dur[i], gg += gap[i], c++;
                const krec *k = launches[1][a + j];
                fprintf(f, "  L%-3d %9.2f us  gap %7.2f  grid %6u smem %6u  %s\n", j, d / used / c, gg / used / c,
                        k->gx, k->smem, names[k->name].c_str());
                tot += d / used / c, totg += gg / used / c;
            }
            fprintf(f, "  layer: kernels %.2f us + gaps %.2f us\n", tot, totg);
        }
    }
    if (!eager.empty()) fprintf(f, "eager kernels (outside graphs), total us / count:\n");
    for (auto &e : eager) fprintf(f, "  %10.1f us %6d  %s\n", e.second.first, e.second.second, names[e.first].c_str());
    if (f != stderr) fclose(f);
}

} // namespace

extern "C" int InitializeInjection(void) {
    if (cuptiActivityRegisterCallbacks(buf_requested, buf_completed) != CUPTI_SUCCESS) return 0;
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
    atexit(report);
    return 1;
}
