use super::*;
use proptest::prelude::*;

fn err(text: &str) -> String {
    parse(text.as_bytes(), None).unwrap_err().0
}

fn check_err(text: &str, n: usize) -> String {
    check(&parse(text.as_bytes(), None).unwrap(), n)
        .unwrap_err()
        .0
}

const GOOD: &str = "\
ds:
  max_pts: 100
  gt_url: https://example.invalid/gt
  1: {operation: insert, start: 0, end: 80}
  '2': {operation: search}
  3:
    operation: delete
    start: 10
    end: 20
  4: {operation: replace, tags_start: 20, tags_end: 30, ids_start: 100, ids_end: 110}
  5: {operation: insert, start: 80, end: 100}
  6: {operation: search}
";

#[test]
fn parses_and_checks_a_runbook() {
    let rb = parse(GOOD.as_bytes(), None).unwrap();
    assert_eq!(rb.dataset, "ds");
    assert_eq!(rb.max_pts, 100);
    assert_eq!(rb.steps.len(), 6);
    assert_eq!(rb.steps[1], Step::Search);
    assert_eq!(
        rb.steps[3],
        Step::Replace {
            tags_start: 20,
            tags_end: 30,
            ids_start: 100,
            ids_end: 110
        }
    );
    let plan = check(&rb, 200).unwrap();
    assert_eq!(
        plan.counts,
        Counts {
            insert: 2,
            delete: 1,
            search: 2,
            replace: 1,
            peak_active: 90
        }
    );
    assert_eq!(plan.ops[0], Op::Insert(0..80));
    assert_eq!(
        plan.ops[3],
        Op::Replace {
            tags: 20..30,
            rows: 100..110
        }
    );
    // Steps in any order in the file run in numeric order.
    let shuffled =
        "ds:\n  2: {operation: search}\n  max_pts: 5\n  1: {operation: insert, start: 0, end: 5}\n";
    let rb = parse(shuffled.as_bytes(), None).unwrap();
    assert_eq!(rb.steps[0], Step::Insert { start: 0, end: 5 });
}

#[test]
fn the_top_level_names_datasets() {
    assert!(err("").contains("a runbook is a mapping"), "{}", err(""));
    assert!(err("[1, 2]").contains("a runbook is a mapping"));
    assert!(err("{}").contains("a runbook is a mapping"));
    assert!(err("ds: [").starts_with("not YAML"), "{}", err("ds: ["));
    assert!(err("a: 1\n---\nb: 2\n").starts_with("not YAML"));
    let two = "b: {max_pts: 1}\na: {max_pts: 2, 1: {operation: search}}\n";
    assert_eq!(
        err(two),
        "the file holds runbooks for ['a', 'b']: name one (--runbook-dataset)"
    );
    let rb = parse(two.as_bytes(), Some("a")).unwrap();
    assert_eq!((rb.max_pts, rb.steps.len()), (2, 1));
    assert_eq!(
        parse(two.as_bytes(), Some("c")).unwrap_err().0,
        "no runbook for dataset 'c'; the file has ['a', 'b']"
    );
    assert_eq!(
        err("a: {max_pts: 1}\na: {max_pts: 2}\n"),
        "the runbook of 'a' appears twice"
    );
}

#[test]
fn max_pts_and_step_numbering() {
    assert_eq!(err("ds: 3"), "ds: max_pts is missing");
    assert_eq!(
        err("ds: {1: {operation: search}}"),
        "ds: max_pts is missing"
    );
    assert_eq!(
        err("ds: {max_pts: '10'}"),
        "ds: max_pts must be an integer, got '10'"
    );
    assert_eq!(
        err("ds: {max_pts: 1, max_pts: 2}"),
        "ds: max_pts appears twice"
    );
    assert_eq!(
        err("ds: {max_pts: 1, steps: 2}"),
        "ds: unknown key 'steps' (steps are numbered 1, 2, …)"
    );
    assert_eq!(
        err("ds: {max_pts: 1, true: 2}"),
        "ds: unknown key True (steps are numbered 1, 2, …)"
    );
    assert_eq!(
        err("ds: {max_pts: 1, 1: {operation: search}, '1': {operation: search}}"),
        "ds: step 1 appears twice"
    );
    assert_eq!(
        err("ds: {max_pts: 1, 2: {operation: search}, 2: {operation: search}}"),
        "ds: step 2 appears twice"
    );
    assert_eq!(
        err("ds: {max_pts: 1, 1: {operation: search}, 3: {operation: search}}"),
        "ds: steps must be numbered 1..2 without gaps"
    );
    assert_eq!(
        err("ds: {max_pts: 1, 0: {operation: search}}"),
        "ds: steps must be numbered 1..1 without gaps"
    );
    assert_eq!(
        err(
            "ds: {max_pts: 1, '99999999999999999999999999999999999999999999': {operation: search}}"
        ),
        "ds: steps must be numbered 1..1 without gaps"
    );
    // No steps at all is a runbook that does nothing.
    assert!(parse(b"ds: {max_pts: 1}", None).unwrap().steps.is_empty());
}

#[test]
fn step_errors_name_the_step() {
    let step = |s: &str| {
        err(&format!(
            "ds:\n  max_pts: 10\n  1: {{operation: search}}\n  2: {s}\n"
        ))
    };
    assert_eq!(step("7"), "step 2: no operation");
    assert_eq!(step("{start: 1}"), "step 2: no operation");
    assert_eq!(
        step("{operation: upsert}"),
        "step 2: unknown operation 'upsert' (known: insert, delete, search, replace)"
    );
    assert_eq!(
        step("{operation: 5}"),
        "step 2: unknown operation 5 (known: insert, delete, search, replace)"
    );
    assert_eq!(
        step("{operation: search, start: 1}"),
        "step 2 (search): unknown field(s) ['start']"
    );
    assert_eq!(
        step("{operation: insert, start: 1, end: 2, stop: 3, 4: 5}"),
        "step 2 (insert): unknown field(s) ['4', 'stop']"
    );
    assert_eq!(
        step("{operation: replace, tags_start: 1, tags_end: 2}"),
        "step 2 (replace): missing ['ids_end', 'ids_start']"
    );
    assert_eq!(
        step("{operation: delete, start: 1, start: 2, end: 3}"),
        "step 2 (delete): field 'start' appears twice"
    );
    for (v, shown) in [
        ("'3'", "'3'"),
        ("3.5", "3.5"),
        ("true", "True"),
        ("null", "None"),
        ("[3]", "[3]"),
        ("{a: 1}", "{'a': 1}"),
    ] {
        assert_eq!(
            step(&format!("{{operation: insert, start: 1, end: {v}}}")),
            format!("step 2: end must be an integer, got {shown}")
        );
    }
    assert!(step("{operation: !custom insert, start: 1, end: 2}").contains("tags"));
}

#[test]
fn the_check_names_the_step_of_the_first_problem() {
    let rb = |steps: &str| format!("ds:\n  max_pts: 50\n{steps}");
    assert_eq!(
        check_err(&rb(""), 20),
        "max_pts 50 must be in 1..=20 (the dataset's rows)"
    );
    assert_eq!(
        check_err("ds: {max_pts: 0}", 20),
        "max_pts 0 must be in 1..=20 (the dataset's rows)"
    );
    let one = |s: &str| {
        check_err(
            &rb(&format!(
                "  1: {{operation: insert, start: 0, end: 10}}\n  2: {s}\n"
            )),
            100,
        )
    };
    assert_eq!(
        one("{operation: insert, start: 5, end: 5}"),
        "step 2 (insert): range 5..5 is empty or outside 0..100"
    );
    assert_eq!(
        one("{operation: insert, start: -1, end: 5}"),
        "step 2 (insert): range -1..5 is empty or outside 0..100"
    );
    assert_eq!(
        one("{operation: delete, start: 90, end: 101}"),
        "step 2 (delete): range 90..101 is empty or outside 0..100"
    );
    assert_eq!(
        one("{operation: insert, start: 8, end: 12}"),
        "step 2 (insert 8..12): ids already active from an earlier insert, first 8"
    );
    assert_eq!(
        one("{operation: delete, start: 5, end: 15}"),
        "step 2 (delete 5..15): ids never inserted or deleted already, first 10"
    );
    assert_eq!(
        one("{operation: replace, tags_start: 0, tags_end: 5, ids_start: 50, ids_end: 56}"),
        "step 2 (replace): 5 tags but 6 rows"
    );
    assert_eq!(
        one("{operation: replace, tags_start: 5, tags_end: 15, ids_start: 50, ids_end: 60}"),
        "step 2 (replace): id 10 is not active"
    );
    assert_eq!(
        one("{operation: replace, tags_start: 0, tags_end: 5, ids_start: 99, ids_end: 104}"),
        "step 2 (replace ids): range 99..104 is empty or outside 0..100"
    );
    assert_eq!(
        one("{operation: replace, tags_start: 5, tags_end: 0, ids_start: 0, ids_end: 5}"),
        "step 2 (replace tags): range 5..0 is empty or outside 0..100"
    );
    assert_eq!(
        one("{operation: insert, start: 10, end: 51}"),
        "step 2: 51 points active, more than max_pts 50"
    );
    // A delete then an insert of the same rows is fine; deleting twice is not.
    let again = rb("  1: {operation: insert, start: 0, end: 10}\n  2: {operation: delete, start: 0, end: 10}\n  3: {operation: insert, start: 0, end: 10}\n  4: {operation: delete, start: 0, end: 10}\n  5: {operation: delete, start: 0, end: 1}\n");
    assert_eq!(
        check_err(&again, 100),
        "step 5 (delete 0..1): ids never inserted or deleted already, first 0"
    );
}

#[test]
fn hostile_yaml_is_an_error() {
    // Deep nesting: the parser's recursion limit.
    let deep = format!("ds: {}1{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(err(&deep).starts_with("not YAML"));
    let deep_map = "a: ".repeat(10_000);
    assert!(parse(deep_map.as_bytes(), None).is_err());
    let indented: String = (0..300).map(|i| format!("{}a:\n", " ".repeat(i))).collect();
    assert!(
        err(&indented).contains("recursion limit"),
        "{}",
        err(&indented)
    );
    let flow = format!("ds: {}1{}", "[".repeat(120), "]".repeat(120));
    assert!(err(&flow).contains("max_pts is missing"), "{}", err(&flow));
    // Billion laughs: alias expansion is bounded.
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let p = i - 1;
        bomb += &format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        );
    }
    assert!(err(&bomb).starts_with("not YAML"), "{}", err(&bomb));
    // Not UTF-8, NUL bytes, a recursive alias.
    assert!(parse(&[0xff, 0xfe, 0x00, 0x41], None).is_err());
    assert!(parse(b"a: &x [*x]", None).is_err());
    // An alias to a step is a step like any other.
    let aliased = "ds:\n  max_pts: 5\n  1: &s {operation: search}\n  2: *s\n";
    assert_eq!(parse(aliased.as_bytes(), None).unwrap().steps.len(), 2);
}

/// A runbook's YAML from (operation, four small integers).
fn yaml_of(max_pts: i64, steps: &[(u8, [i64; 4])]) -> String {
    let mut y = format!("ds:\n  max_pts: {max_pts}\n");
    for (i, (op, v)) in steps.iter().enumerate() {
        let body = match op % 4 {
            0 => format!("{{operation: insert, start: {}, end: {}}}", v[0], v[1]),
            1 => format!("{{operation: delete, start: {}, end: {}}}", v[0], v[1]),
            2 => "{operation: search}".to_string(),
            _ => format!(
                "{{operation: replace, tags_start: {}, tags_end: {}, ids_start: {}, ids_end: {}}}",
                v[0], v[1], v[2], v[3]
            ),
        };
        y += &format!("  {}: {body}\n", i + 1);
    }
    y
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(rb) = parse(&bytes, None) {
            let _ = check(&rb, 100);
        }
    }

    #[test]
    fn garbled_runbooks_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
    ) {
        let mut bytes = GOOD.as_bytes().to_vec();
        for (at, byte, kind) in edits {
            let i = at.index(bytes.len() + 1);
            match kind {
                0 if i < bytes.len() => bytes[i] = byte,
                1 => bytes.insert(i, byte),
                _ => bytes.truncate(i),
            }
        }
        if let Ok(rb) = parse(&bytes, None) {
            let _ = check(&rb, 150);
        }
    }

    /// Random runbooks of small ranges: the check never panics, and a
    /// runbook it accepts keeps every invariant when replayed.
    #[test]
    fn the_check_accepts_only_consistent_runbooks(
        max_pts in -2i64..40,
        steps in proptest::collection::vec((any::<u8>(), [-3i64..45, -3i64..45, -3i64..45, -3i64..45]), 0..24),
    ) {
        let n = 40usize;
        let rb = parse(yaml_of(max_pts, &steps).as_bytes(), None).unwrap();
        prop_assert_eq!(rb.steps.len(), steps.len());
        match check(&rb, n) {
            Ok(plan) => {
                let mut active = vec![false; n];
                for op in &plan.ops {
                    match op {
                        Op::Insert(r) => { prop_assert!(active[r.clone()].iter().all(|a| !a)); active[r.clone()].fill(true); }
                        Op::Delete(r) => { prop_assert!(active[r.clone()].iter().all(|&a| a)); active[r.clone()].fill(false); }
                        Op::Replace { tags, rows } => {
                            prop_assert!(active[tags.clone()].iter().all(|&a| a));
                            prop_assert_eq!(tags.len(), rows.len());
                            prop_assert!(!rows.is_empty() && rows.end <= n);
                        }
                        Op::Search => {}
                    }
                    prop_assert!(active.iter().filter(|&&a| a).count() <= plan.max_pts);
                }
            }
            Err(e) => prop_assert!(e.0.starts_with("step ") || e.0.starts_with("max_pts "), "{}", e.0),
        }
    }
}
