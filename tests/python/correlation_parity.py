"""scipy's Spearman and Pearson coefficients and two-sided p-values for the samples on stdin.

stdin: a JSON list of [a, b] pairs of equal-length lists; stdout: a JSON list of
[spearman, spearman_p, pearson, pearson_p] (null where scipy gives NaN).
Reference of tests/correlation_parity.rs.
"""
import json
import math
import sys
import warnings

from scipy import stats

warnings.simplefilter("ignore")  # constant inputs: scipy warns and returns NaN
out = []
for a, b in json.load(sys.stdin):
    s = stats.spearmanr(a, b)
    p = stats.pearsonr(a, b)
    row = [float(s.statistic), float(s.pvalue), float(p.statistic), float(p.pvalue)]
    out.append([None if math.isnan(x) else x for x in row])
json.dump(out, sys.stdout)
