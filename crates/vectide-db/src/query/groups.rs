//! Grouped queries (`/points/query/groups`): the request, the groups of
//! its answer and how an answer's points are put in them.

use super::{Prefetch, QueryRequest, ScoredPoint};
use crate::path::KeyPath;
use serde_json::Value;
use std::collections::HashMap;

/// A grouped query (Qdrant's `/points/query/groups`): the query's answer
/// put in groups by the value(s) at a payload key path.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupsRequest {
    /// The query; its `limit` is the number of groups (offset 0).
    pub query: QueryRequest,
    pub group_by: KeyPath,
    /// Most hits per group.
    pub group_size: usize,
}

/// One group of a grouped query's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct PointGroup {
    /// The value the group's points share at `group_by`: an integer or a
    /// string.
    pub id: Value,
    pub hits: Vec<ScoredPoint>,
}

/// Sets every (nested) prefetch's limit to `n`.
pub(super) fn lift_limits(prefetch: &mut [Prefetch], n: usize) {
    for p in prefetch {
        p.limit = n;
        lift_limits(&mut p.prefetch, n);
    }
}

/// The distinct values (in payload order) that put a point in groups, with
/// their JSON text (1 and "1" differ): the values at `by` (an array there
/// gives its elements), or `None` when there are none or one of them is
/// neither an integer nor a string (the point then joins no group, as in
/// Qdrant).
fn group_ids(payload: &Value, by: &KeyPath) -> Option<Vec<(String, Value)>> {
    if !payload.is_object() {
        return None;
    }
    let mut found = Vec::new();
    by.values(payload, true, &mut found);
    if found.is_empty()
        || !found
            .iter()
            .all(|v| v.is_string() || v.is_i64() || v.is_u64())
    {
        return None;
    }
    let mut seen = std::collections::HashSet::with_capacity(found.len());
    Some(
        found
            .into_iter()
            .map(|v| (v.to_string(), v))
            .filter(|(key, _)| seen.insert(key.clone()))
            .map(|(key, v)| (key, v.clone()))
            .collect(),
    )
}

/// `points` (in answer order) in groups by their values at `by`: at most
/// `limit` groups, in order of first appearance, of at most `size` hits.
pub(super) fn group(
    points: Vec<ScoredPoint>,
    by: &KeyPath,
    size: usize,
    limit: usize,
) -> Vec<PointGroup> {
    let mut out: Vec<PointGroup> = Vec::new();
    // A group's place by its value's JSON text.
    let mut place: HashMap<String, usize> = HashMap::new();
    for p in points {
        let Some(ids) = p.payload.as_ref().and_then(|x| group_ids(x, by)) else {
            continue;
        };
        for (key, id) in ids {
            let i = match place.get(&key) {
                Some(&i) => i,
                None if out.len() < limit => {
                    place.insert(key, out.len());
                    out.push(PointGroup {
                        id,
                        hits: Vec::new(),
                    });
                    out.len() - 1
                }
                None => continue,
            };
            if out[i].hits.len() < size {
                out[i].hits.push(p.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::query::eval::tests::{only_ids, plane};
    use crate::query::GroupsRequest;
    use crate::{Collection, ExtId};
    use serde_json::{json, Value};
    use vectide_core::Metric;

    fn grouped(c: &Collection, body: Value) -> Vec<(Value, Vec<(u64, f32)>)> {
        c.query_groups(&GroupsRequest::parse(&body).unwrap())
            .unwrap()
            .into_iter()
            .map(|g| {
                let hits = g
                    .hits
                    .iter()
                    .map(|p| match p.id {
                        ExtId::Num(n) => (n, p.score),
                        _ => unreachable!(),
                    })
                    .collect();
                (g.id, hits)
            })
            .collect()
    }

    fn group_ids_of(g: &[(Value, Vec<(u64, f32)>)]) -> Vec<(Value, Vec<u64>)> {
        g.iter().map(|(id, h)| (id.clone(), only_ids(h))).collect()
    }

    #[test]
    fn groups_through_a_collection_answer_as_local_mode() {
        let (_dir, db) = plane();
        let c = db.collection("c").unwrap();
        let q = |by: &str, limit: usize, size: usize| {
            group_ids_of(&grouped(
                &c,
                json!({"query": [1.0, 0.3], "group_by": by, "limit": limit, "group_size": size}),
            ))
        };
        assert_eq!(
            q("g", 2, 2),
            vec![(json!(0), vec![3, 6]), (json!(2), vec![2, 5])]
        );
        // An array puts a point in a group per value.
        assert_eq!(
            q("t", 5, 2),
            vec![
                (json!("a"), vec![3, 5]),
                (json!("b"), vec![3, 5]),
                (json!("c"), vec![2, 4])
            ]
        );
        // Floats, and an array holding a bool, group nothing; nor does a
        // key no point has.
        assert!(q("f", 5, 2).is_empty() && q("bad", 5, 2).is_empty() && q("nope", 5, 2).is_empty());
        // Every point in one group: the first group_size of the answer.
        let all = q("g", 10, 10);
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].1.len(), 4);
        // No query: id order, score 1.
        let none = grouped(&c, json!({"group_by": "g", "limit": 5, "group_size": 2}));
        assert_eq!(
            group_ids_of(&none),
            vec![
                (json!(0), vec![0, 3]),
                (json!(1), vec![1, 4]),
                (json!(2), vec![2, 5])
            ]
        );
        assert!(none.iter().flat_map(|g| &g.1).all(|h| h.1 == 1.0));
        // Prefetch limits are lifted to the whole collection.
        let fused = grouped(
            &c,
            json!({"prefetch": [{"query": [1.0, 0.3], "limit": 2}, {"query": [1.0, 0.9], "limit": 2}],
                   "query": {"fusion": "rrf"}, "group_by": "g", "limit": 5, "group_size": 2}),
        );
        let want = [
            (0, [(3, 0.625), (9, 0.5909)]),
            (2, [(2, 0.4444), (8, 0.4333)]),
            (1, [(4, 0.3929), (7, 0.3611)]),
        ];
        assert_eq!(fused.len(), 3);
        for ((gid, hits), (wid, whits)) in fused.iter().zip(want) {
            assert_eq!(gid, &json!(wid));
            for (h, w) in hits.iter().zip(whits) {
                assert!(h.0 == w.0 && (h.1 - w.1).abs() < 1e-4, "{fused:?}");
            }
        }
        // Payloads only when asked; the grouping reads them regardless.
        let g = c
            .query_groups(
                &GroupsRequest::parse(
                    &json!({"query": [1.0, 0.3], "group_by": "g", "limit": 1, "group_size": 1, "with_payload": false}),
                )
                .unwrap(),
            )
            .unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].hits[0].payload, None);
    }

    #[test]
    fn groups_read_as_far_as_they_need_and_no_further() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::Database::open(dir.path(), crate::Options::default()).unwrap();
        let c = db
            .create_collection("big", crate::CollectionConfig::new(1, Metric::L2, "flat"))
            .unwrap();
        // 2,000 points on a line; group k holds the points i with
        // i % 500 == k, so the nearest to 0 fill groups 0, 1, ... in
        // order and group 0's third point is 1,000 away.
        let points: Vec<crate::PointInput> = (0..2000u64)
            .map(|i| crate::PointInput {
                id: ExtId::Num(i),
                vector: vec![i as f32],
                payload: json!({"k": i % 500}),
            })
            .collect();
        c.upsert(&points).unwrap();
        let g = grouped(
            &c,
            json!({"query": [0.0], "group_by": "k", "limit": 2, "group_size": 3}),
        );
        assert_eq!(
            group_ids_of(&g),
            vec![
                (json!(0), vec![0, 500, 1000]),
                (json!(1), vec![1, 501, 1001])
            ]
        );
        let g = grouped(
            &c,
            json!({"query": [0.0], "group_by": "k", "limit": 600, "group_size": 5,
                   "filter": {"must": [{"key": "k", "range": {"lt": 3}}]}}),
        );
        assert_eq!(g.len(), 3);
        assert!(g.iter().all(|x| x.1.len() == 4));
    }
}
