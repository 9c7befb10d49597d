use super::*;
use crate::{AbstractTree, Config, SequenceNumberCounter};
use std::sync::Arc;
use test_log::test;

#[test]
fn leveled_empty_levels() -> crate::Result<()> {
    let dir = tempfile::tempdir()?;
    let tree = Config::new(
        dir.path(),
        SequenceNumberCounter::default(),
        SequenceNumberCounter::default(),
    )
    .open()?;

    let strategy = Arc::new(Strategy::default());
    tree.compact(strategy, 0)?;

    assert_eq!(0, tree.table_count());
    Ok(())
}

#[test]
fn leveled_l0_below_limit() -> crate::Result<()> {
    let dir = tempfile::tempdir()?;
    let tree = Config::new(
        dir.path(),
        SequenceNumberCounter::default(),
        SequenceNumberCounter::default(),
    )
    .open()?;

    for i in 0..3u8 {
        tree.insert([b'k', i].as_slice(), "v", 0);
        tree.flush_active_memtable(0)?;
    }

    let before = tree.table_count();
    assert_eq!(3, before);

    let strategy = Arc::new(Strategy::default());
    tree.compact(strategy, 0)?;

    assert_eq!(before, tree.table_count());

    Ok(())
}

#[test]
fn leveled_l0_reached_limit() -> crate::Result<()> {
    let dir = tempfile::tempdir()?;
    let tree = Config::new(
        dir.path(),
        SequenceNumberCounter::default(),
        SequenceNumberCounter::default(),
    )
    .open()?;

    for i in 0..4u8 {
        // NOTE: Tables need to overlap
        tree.insert("a", "v", 0);
        tree.insert([b'k', i].as_slice(), "v", 0);
        tree.insert("z", "v", 0);
        tree.flush_active_memtable(0)?;
    }

    assert_eq!(4, tree.table_count());

    let strategy = Arc::new(Strategy::default());
    tree.compact(strategy, 0)?;

    assert_eq!(1, tree.table_count());

    Ok(())
}

#[test]
fn leveled_l0_reached_limit_disjoint() -> crate::Result<()> {
    let dir = tempfile::tempdir()?;
    let tree = Config::new(
        dir.path(),
        SequenceNumberCounter::default(),
        SequenceNumberCounter::default(),
    )
    .open()?;

    for i in 0..4u8 {
        tree.insert([b'k', i].as_slice(), "v", 0);
        tree.flush_active_memtable(0)?;
    }

    assert_eq!(4, tree.table_count());

    let strategy = Arc::new(Strategy::default());
    tree.compact(strategy, 0)?;

    assert_eq!(4, tree.table_count());

    Ok(())
}

#[test]
fn leveled_l0_reached_limit_disjoint_l1() -> crate::Result<()> {
    let dir = tempfile::tempdir()?;
    let tree = Config::new(
        dir.path(),
        SequenceNumberCounter::default(),
        SequenceNumberCounter::default(),
    )
    .open()?;

    for i in 0..4 {
        // NOTE: Tables need to overlap
        tree.insert("a", "v", i);
        tree.insert("b", "v", i);
        tree.flush_active_memtable(0)?;
    }

    let fifo = Arc::new(Strategy::default());
    tree.compact(fifo, 0)?;

    assert_eq!(1, tree.table_count());

    for i in 0..4u8 {
        tree.insert([b'k', i].as_slice(), "v", 0);
        tree.flush_active_memtable(0)?;
    }

    assert_eq!(5, tree.table_count());

    let strategy = Arc::new(Strategy::default());
    tree.compact(strategy, 0)?;

    assert_eq!(5, tree.table_count());

    Ok(())
}

#[test]
#[expect(clippy::unwrap_used)]
fn leveled_sequential_inserts() -> crate::Result<()> {
    let dir = tempfile::tempdir()?;
    let tree = Config::new(
        dir.path(),
        SequenceNumberCounter::default(),
        SequenceNumberCounter::default(),
    )
    .open()?;

    let strategy = Arc::new(Strategy {
        target_size: 1,
        ..Default::default()
    });

    let mut table_count = 0;

    for k in 0u64..100 {
        table_count += 1;

        tree.insert(k.to_be_bytes(), "", 0);
        tree.flush_active_memtable(0)?;

        assert_eq!(table_count, tree.table_count());
        tree.compact(strategy.clone(), 0)?;
        assert_eq!(table_count, tree.table_count());

        for idx in 1..=5 {
            assert_eq!(
                0,
                tree.current_version().level(idx).unwrap().len(),
                "no tables should be in intermediary level (L{idx})",
            );
        }
    }

    Ok(())
}

/// eventfold patch: the keys of `seq` (one byte) numbered `i`, in order.
fn seq_key(seq: u8, i: u16) -> Vec<u8> {
    let mut k = vec![seq];
    k.extend_from_slice(&i.to_be_bytes());
    k
}

/// eventfold patch (`Config::split_tables_at_prefix`, `movable_l0_tables`): a flush writes
/// a table per sequence, and the L0 tables of two flushes, which overlap neither each
/// other nor anything below, move down as they are instead of being merged.
#[test]
fn leveled_moves_the_tables_of_sequences_instead_of_merging_them() -> crate::Result<()> {
    let dir = tempfile::tempdir()?;
    let tree = Config::new(
        dir.path(),
        SequenceNumberCounter::default(),
        SequenceNumberCounter::default(),
    )
    .open()?;
    tree.tree_config().split_tables_at_prefix(1);

    let mut seqno = 0;
    for round in 0..2u16 {
        for seq in *b"abcd" {
            for i in 0..10 {
                tree.insert(seq_key(seq, round * 10 + i), "v", seqno);
                seqno += 1;
            }
        }
        tree.flush_active_memtable(0)?;
        assert_eq!(
            4 * usize::from(round + 1),
            tree.table_count(),
            "a table per sequence"
        );
    }
    let ids = |tree: &crate::AnyTree| -> HashSet<TableId> {
        tree.current_version()
            .iter_tables()
            .map(Table::id)
            .collect()
    };
    let before = ids(&tree);
    assert_eq!(Some(8), tree.level_table_count(0));

    tree.compact(Arc::new(Strategy::default()), seqno)?;

    assert_eq!(Some(0), tree.level_table_count(0), "all moved out of L0");
    assert_eq!(before, ids(&tree), "moved, not rewritten");
    for seq in *b"abcd" {
        for i in 0..20 {
            assert!(tree.get(seq_key(seq, i), seqno)?.is_some());
        }
    }

    // A write inside a sequence's range overlaps the moved table there: it is not moved
    // over it, and reads see the newer value.
    tree.insert(seq_key(b'b', 5), "newer", seqno);
    tree.flush_active_memtable(0)?;
    tree.compact(Arc::new(Strategy::default()), seqno + 1)?;
    assert_eq!(Some(1), tree.level_table_count(0));
    assert_eq!(
        Some(crate::Slice::from("newer")),
        tree.get(seq_key(b'b', 5), seqno + 1)?
    );
    Ok(())
}

/// eventfold patch: without `split_tables_at_prefix`, a flush writes one table, and the
/// tables of two flushes whose key ranges interleave are merged by the L0 compaction.
#[test]
fn leveled_merges_interleaved_flushes_without_the_split() -> crate::Result<()> {
    let dir = tempfile::tempdir()?;
    let tree = Config::new(
        dir.path(),
        SequenceNumberCounter::default(),
        SequenceNumberCounter::default(),
    )
    .open()?;

    let mut seqno = 0;
    for round in 0..4u16 {
        for seq in *b"abcd" {
            tree.insert(seq_key(seq, round), "v", seqno);
            seqno += 1;
        }
        tree.flush_active_memtable(0)?;
    }
    assert_eq!(4, tree.table_count());

    tree.compact(Arc::new(Strategy::default()), seqno)?;

    assert_eq!(1, tree.table_count());
    Ok(())
}

/// eventfold patch (`consolidation_window`): the small tables of one sequence that moves
/// left in a level are merged in place once there are four; without the split they stay.
#[test]
fn leveled_consolidates_the_small_tables_of_a_sequence() -> crate::Result<()> {
    for split in [true, false] {
        let dir = tempfile::tempdir()?;
        let tree = Config::new(
            dir.path(),
            SequenceNumberCounter::default(),
            SequenceNumberCounter::default(),
        )
        .open()?;
        if split {
            tree.tree_config().split_tables_at_prefix(1);
        }
        let mut seqno = 0;
        for round in 0..4u16 {
            for i in 0..10 {
                tree.insert(seq_key(b'a', round * 10 + i), "v", seqno);
                seqno += 1;
            }
            tree.flush_active_memtable(0)?;
            tree.compact(Arc::new(Strategy::default()), seqno)?;
            assert_eq!(Some(0), tree.level_table_count(0), "moved");
        }
        assert_eq!(4, tree.table_count());

        tree.compact(Arc::new(Strategy::default()), seqno)?;

        assert_eq!(
            if split { 1 } else { 4 },
            tree.table_count(),
            "split: {split}"
        );
        for i in 0..40 {
            assert!(tree.get(seq_key(b'a', i), seqno)?.is_some());
        }
    }
    Ok(())
}

/// eventfold patch (`consolidation_window`): size-tiered: a consolidated table is merged
/// again only once the small tables after it are together at least as large.
#[test]
fn leveled_consolidates_a_sequence_size_tiered() -> crate::Result<()> {
    let dir = tempfile::tempdir()?;
    let tree = Config::new(
        dir.path(),
        SequenceNumberCounter::default(),
        SequenceNumberCounter::default(),
    )
    .open()?;
    tree.tree_config().split_tables_at_prefix(1);
    let value = vec![7u8; 100];
    let mut seqno = 0;
    let mut flush = |tree: &crate::AnyTree, round: u16| -> crate::Result<()> {
        for i in 0..1_000 {
            tree.insert(seq_key(b'a', round * 1_000 + i), value.clone(), seqno);
            seqno += 1;
        }
        tree.flush_active_memtable(0)?;
        tree.compact(Arc::new(Strategy::default()), seqno)?;
        tree.compact(Arc::new(Strategy::default()), seqno)
    };
    for round in 0..4 {
        flush(&tree, round)?;
    }
    assert_eq!(1, tree.table_count(), "four equal tables merged");
    for round in 4..7 {
        flush(&tree, round)?;
    }
    assert_eq!(
        4,
        tree.table_count(),
        "three small ones are less than the merged one"
    );
    flush(&tree, 7)?;
    assert_eq!(1, tree.table_count(), "four are as large");
    Ok(())
}

/// eventfold patch (`CONSOLIDATE_BELOW`): tables of a sequence of at least a sixteenth of
/// the target size are left as they are; the same tables under a larger target merge.
#[test]
fn leveled_leaves_tables_of_a_sixteenth_of_the_target_unmerged() -> crate::Result<()> {
    let value = vec![7u8; 100];
    for (target, tables) in [(1_000_000u64, 4), (64 << 20, 1)] {
        let dir = tempfile::tempdir()?;
        let tree = Config::new(
            dir.path(),
            SequenceNumberCounter::default(),
            SequenceNumberCounter::default(),
        )
        .open()?;
        tree.tree_config().split_tables_at_prefix(1);
        let strategy = Arc::new(Strategy::default().with_table_target_size(target));
        let mut seqno = 0;
        for round in 0..4u16 {
            for i in 0..1_000 {
                tree.insert(seq_key(b'a', round * 1_000 + i), value.clone(), seqno);
                seqno += 1;
            }
            tree.flush_active_memtable(0)?;
            tree.compact(strategy.clone(), seqno)?;
        }
        let sizes: Vec<u64> = tree
            .current_version()
            .iter_tables()
            .map(|t| t.file_size())
            .collect();
        assert!(
            sizes
                .iter()
                .all(|&s| s >= 1_000_000 / CONSOLIDATE_BELOW && s * CONSOLIDATE_BELOW < 64 << 20),
            "each flush's table is between the two thresholds: {sizes:?}"
        );
        tree.compact(strategy.clone(), seqno)?;
        assert_eq!(tables, tree.table_count(), "target {target}");
    }
    Ok(())
}
