//! The grouped cache of an executor, as PaddlePaddle's MKL-DNN blob cache is used: objects
//! are kept per session and per input shape, a session keeps a bounded number of shapes
//! (the oldest shape goes whole), and each executor clears exactly what it created when it
//! finishes, even while an outer executor defers clears with a hold.
//!
//! ```text
//! cargo run --example grouped_executor
//! ```

use runcache::grouped::{GroupedCache, OwnerId};

/// A primitive built for one layer at one input shape.
#[derive(Debug)]
struct Primitive {
    layer: &'static str,
    shape: Vec<usize>,
}

/// An executor: runs every layer of a model at one input shape, building what is missing.
fn run(
    cache: &GroupedCache<u32, Vec<usize>, &'static str, Primitive>,
    owner: OwnerId,
    session: u32,
    shape: &[usize],
) -> usize {
    let shape = shape.to_vec();
    let executor = cache.owner(owner);
    let mut built = 0;
    for layer in ["conv1", "relu1", "conv2", "fc"] {
        executor.get_or_insert_with(&session, &shape, &layer, || {
            built += 1;
            Primitive {
                layer,
                shape: shape.clone(),
            }
        });
    }
    built
}

fn main() {
    // At most two input shapes per session.
    let cache: GroupedCache<u32, Vec<usize>, &'static str, Primitive> = GroupedCache::new(2);

    let built = run(&cache, OwnerId(1), 0, &[1, 3, 224, 224]);
    println!(
        "executor 1, shape 224: built {built}, {} objects cached",
        cache.len()
    );
    let again = run(&cache, OwnerId(1), 0, &[1, 3, 224, 224]);
    println!("executor 1 again: built {again} (everything was cached)");
    assert_eq!(again, 0);

    run(&cache, OwnerId(2), 0, &[1, 3, 256, 256]);
    run(&cache, OwnerId(2), 0, &[1, 3, 320, 320]); // a third shape: the oldest group goes
    println!(
        "executor 2, shapes 256 and 320: {} shapes in session 0, {} objects",
        cache.group_count(&0),
        cache.len()
    );
    assert!(
        cache.get(&0, &vec![1, 3, 224, 224], "conv1").is_none(),
        "shape 224 was evicted whole"
    );

    // A nested executor finishes while the outer one still runs: its clear waits.
    let held = cache
        .get(&0, &vec![1, 3, 256, 256], "conv1")
        .expect("cached");
    let hold = cache.hold_clears();
    cache.clear_owner(OwnerId(2));
    println!(
        "executor 2 finished under a hold: {} objects still cached",
        cache.len()
    );
    drop(hold);
    println!("hold released: {} objects cached", cache.len());
    assert!(cache.is_empty());
    println!("a caller still holds {} for {:?}", held.layer, held.shape);
}
