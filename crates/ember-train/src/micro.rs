//! Micro-batches of a mini-batch: cut by a row count, or by a token budget with the rows sorted
//! by length (verl's `use_dynamic_bsz` with `ppo_max_token_len_per_gpu`, bounding the padded
//! rectangle a pass computes rather than packed tokens).

use burn::tensor::Tensor;

/// How a mini-batch's rows are cut into micro-batches.
pub(crate) struct Cut<'a> {
    /// Rows per micro-batch at most (0: no bound).
    pub(crate) max_rows: usize,
    /// Rows × the longest row's tokens per micro-batch at most (0: no bound, rows in order).
    pub(crate) max_tokens: usize,
    /// Per row of the batch, its tokens (rows missing here count 0).
    pub(crate) tokens: &'a [usize],
    /// Per row of the batch, its group: with a token budget a group's rows stay in one
    /// micro-batch where the group fits (an actor that runs a group's prompt once).
    pub(crate) groups: Option<&'a [usize]>,
}

impl Cut<'_> {
    /// The micro-batches of `rows` (a mini-batch's rows, in order). Every row is in exactly one.
    ///
    /// - Without a token budget: consecutive chunks of `max_rows` rows, in the given order.
    /// - With one: units (a row, or a group's rows with `groups`) sorted longest first by their
    ///   longest row (stable), then packed greedily so that each micro-batch's rows × its
    ///   longest row stays within the budget (and its rows within `max_rows` when set). A unit
    ///   over a bound is cut into rows, longest first; a row over the budget is a micro-batch
    ///   of its own (a row is never split).
    pub(crate) fn micro_batches(&self, rows: &[usize]) -> Vec<Vec<usize>> {
        if rows.is_empty() {
            return Vec::new();
        }
        let max_rows = if self.max_rows == 0 {
            rows.len()
        } else {
            self.max_rows
        };
        if self.max_tokens == 0 {
            return rows.chunks(max_rows).map(<[usize]>::to_vec).collect();
        }
        let len = |r: &usize| self.tokens.get(*r).copied().unwrap_or(0);
        let fits = |n: usize, longest: usize| {
            n <= max_rows && n.saturating_mul(longest) <= self.max_tokens
        };
        let mut units = self.units(rows);
        for u in &mut units {
            u.sort_by_key(|r| std::cmp::Reverse(len(r)));
        }
        units.sort_by_key(|u| std::cmp::Reverse(u.first().map_or(0, len)));
        // A unit over a bound goes on as single rows (longest first, as sorted above).
        let pieces = units.into_iter().flat_map(|u| {
            if fits(u.len(), u.first().map_or(0, len)) {
                vec![u]
            } else {
                u.into_iter().map(|r| vec![r]).collect()
            }
        });
        let (mut out, mut cur, mut longest) = (Vec::new(), Vec::new(), 0);
        for piece in pieces {
            let piece_longest = piece.first().map_or(0, len);
            if !cur.is_empty() && !fits(cur.len() + piece.len(), longest.max(piece_longest)) {
                out.push(std::mem::take(&mut cur));
                longest = 0;
            }
            longest = longest.max(piece_longest);
            cur.extend(piece);
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    }

    /// `rows` as units: one per row, or with `groups` one per group (first appearance order).
    fn units(&self, rows: &[usize]) -> Vec<Vec<usize>> {
        let Some(groups) = self.groups else {
            return rows.iter().map(|r| vec![*r]).collect();
        };
        let mut units: Vec<Vec<usize>> = Vec::new();
        let mut at: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        for r in rows {
            let Some(g) = groups.get(*r) else {
                units.push(vec![*r]);
                continue;
            };
            match at.get(g) {
                Some(i) => units[*i].push(*r),
                None => {
                    at.insert(*g, units.len());
                    units.push(vec![*r]);
                }
            }
        }
        units
    }
}

/// Per row of a `[rows, steps]` mask, the steps up to and including its last valid one (the
/// columns a pass over that row alone computes); 0 for a row without a valid step.
pub(crate) fn mask_lengths(mask: &Tensor<2>) -> Vec<usize> {
    let [rows, steps] = mask.dims();
    match mask.clone().try_into_vec_as::<f32>() {
        Ok(host) if host.len() == rows * steps => row_lengths(&host, steps),
        _ => vec![steps; rows],
    }
}

/// [`mask_lengths`] of a host mask with `steps` columns.
fn row_lengths(mask: &[f32], steps: usize) -> Vec<usize> {
    mask.chunks(steps.max(1))
        .map(|r| r.iter().rposition(|m| *m != 0.0).map_or(0, |c| c + 1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(max_rows: usize, max_tokens: usize, tokens: &[usize]) -> Cut<'_> {
        Cut {
            max_rows,
            max_tokens,
            tokens,
            groups: None,
        }
    }

    #[test]
    fn row_counts_keep_the_order() {
        let rows = [5, 1, 4, 0, 3];
        assert_eq!(
            cut(2, 0, &[]).micro_batches(&rows),
            vec![vec![5, 1], vec![4, 0], vec![3]]
        );
        assert_eq!(cut(0, 0, &[]).micro_batches(&rows), vec![rows.to_vec()]);
        assert!(cut(2, 0, &[]).micro_batches(&[]).is_empty());
    }

    #[test]
    fn a_token_budget_sorts_longest_first_and_bounds_the_rectangle() {
        // Row r has tokens[r] tokens; budget 100.
        let tokens = [10, 60, 25, 40, 25, 5, 150];
        let rows = [0, 1, 2, 3, 4, 5, 6];
        let c = cut(0, 100, &tokens).micro_batches(&rows);
        // 150 alone (over the budget, never split); 60 alone (2 × 60 > 100); 40 + 25 (2 × 40 ≤
        // 100, 3 × 40 > 100); 25 + 10 + 5 (3 × 25 ≤ 100); rows of equal length keep their order.
        assert_eq!(c, vec![vec![6], vec![1], vec![3, 2], vec![4, 0, 5]]);
        let mut all: Vec<usize> = c.concat();
        all.sort_unstable();
        assert_eq!(all, rows.to_vec());
        // A row cap applies as well.
        assert_eq!(
            cut(2, 1000, &tokens).micro_batches(&[0, 2, 4, 5]),
            vec![vec![2, 4], vec![0, 5]]
        );
    }

    #[test]
    fn groups_stay_whole_where_they_fit() {
        // Groups of rows {0,1}, {2,3}, {4,5,6}; budget 60.
        let tokens = [10, 20, 15, 5, 30, 25, 5];
        let groups = [0, 0, 1, 1, 2, 2, 2];
        let c = Cut {
            max_rows: 0,
            max_tokens: 60,
            tokens: &tokens,
            groups: Some(&groups),
        };
        // Group 2 first (longest 30; 3 × 30 > 60): cut into rows, [4, 5] (2 × 30) and 6 left
        // over; group 0 (longest 20) joins row 6 (3 × 20 = 60); group 1 (longest 15) would
        // make 5 × 20, so it is a micro-batch of its own, whole.
        let m = c.micro_batches(&[0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(m, vec![vec![4, 5], vec![6, 1, 0], vec![2, 3]]);
    }
}
