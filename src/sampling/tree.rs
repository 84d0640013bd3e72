//! The sampled calling context trees: each sample's stack, outermost frame first, adds
//! its weight along one path of its thread's tree and of the merged tree.
//!
//! The one idea: a sample says "this thread was here, called this way" and stands for
//! one period of time (or, for a wall-clock switch-out, for the measured time the thread
//! was away). A node's `samples` and `total_ns` count every sample at or below it; its
//! `self_ns` only those where it was the innermost frame. Functions are named once per
//! address by tendril's own symbol tables ([`FunctionTable`]), so two contexts of one
//! function are one row in the hot spots. Nothing recurses: nodes live in arenas, and a
//! child is always created after its parent, which makes building the profile's nested
//! [`Node`]s a single backwards pass.

use std::collections::{BTreeMap, HashMap};

/// The maps walked once per frame of every sample: a fast, non-cryptographic hash
/// (keys are addresses and small indices the target cannot choose freely).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

use crate::profile::Node;
use crate::symbols::ProcessSymbols;
use crate::symbols::jit::{JIT_MODULE, JitSymbols};

/// Names frames: each distinct function gets a small index, looked up by address once.
pub struct FunctionTable {
    /// (name, module, entry address) by index.
    functions: Vec<(String, String, Option<u64>)>,
    /// (name, module, entry address) → index: two functions that share a name and module
    /// (`static` functions of two files) are two functions.
    index_of: FastMap<(String, String, Option<u64>), u32>,
    /// Frame address → function index, for addresses seen before.
    by_address: FastMap<u64, u32>,
}

/// The name of frames that could not be walked further.
pub const TRUNCATED: &str = "[truncated stack]";
/// The name of a frame outside every mapped module and every known piece of anonymous
/// code (memory mapped since the tables were read, a bad return address).
pub const UNKNOWN: &str = "[unknown]";

impl Default for FunctionTable {
    fn default() -> Self {
        Self::new()
    }
}

impl FunctionTable {
    pub fn new() -> FunctionTable {
        FunctionTable {
            functions: Vec::new(),
            index_of: FastMap::default(),
            by_address: FastMap::default(),
        }
    }

    /// The index of the function named `name` in `module` at `address`.
    pub fn intern(&mut self, name: &str, module: &str, address: Option<u64>) -> u32 {
        let key = (name.to_owned(), module.to_owned(), address);
        if let Some(&index) = self.index_of.get(&key) {
            return index;
        }
        let index = self.functions.len() as u32;
        self.functions
            .push((name.to_owned(), module.to_owned(), address));
        self.index_of.insert(key, index);
        index
    }

    /// The function containing `address`: its symbol (in a second mapping of a
    /// module's code, the symbol of the same byte in the first), else
    /// `module+0xOFFSET` of the address in its module (stripped code that no FDE
    /// covers), else the JIT code's name from the runtime's files or `[jit] 0x…` in
    /// anonymous executable memory (module `[jit]`), else `[unknown]`.
    pub fn symbolize(&mut self, symbols: &ProcessSymbols, jit: &JitSymbols, address: u64) -> u32 {
        if let Some(&index) = self.by_address.get(&address) {
            return index;
        }
        let canonical = symbols.canonical_address(address);
        let function = symbols.lookup(address).or_else(|| {
            canonical
                .filter(|&c| c != address)
                .and_then(|c| symbols.lookup(c))
        });
        let index = if let Some(function) = function {
            let (name, module, entry) = (
                function.name.clone(),
                function.module.clone(),
                function.addr,
            );
            self.intern(&name, &module, Some(entry))
        } else if let Some(module) = symbols.module_at(address) {
            let offset = canonical.unwrap_or(address).wrapping_sub(module.load_bias);
            let name = format!("{}+0x{offset:x}", module.name);
            let module = module.name.clone();
            self.intern(&name, &module, None)
        } else if let Some(named) = jit.name_at(address) {
            self.intern(&named.name, JIT_MODULE, named.start)
        } else {
            self.intern(UNKNOWN, "", None)
        };
        self.by_address.insert(address, index);
        index
    }

    /// Forgets which function each address was in (the tables were read again), keeping
    /// every function's index.
    pub fn forget_addresses(&mut self) {
        self.by_address.clear();
    }

    pub fn name(&self, index: u32) -> (&str, &str) {
        let (name, module, _) = &self.functions[index as usize];
        (name, module)
    }

    pub fn address(&self, index: u32) -> Option<u64> {
        self.functions[index as usize].2
    }

    pub fn len(&self) -> usize {
        self.functions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }
}

/// One calling context in an arena.
#[derive(Debug, Clone, Default)]
struct ContextNode {
    function: u32,
    samples: u64,
    self_samples: u64,
    weight_ns: u64,
    self_weight_ns: u64,
    children: Vec<u32>,
}

/// A calling context tree over [`FunctionTable`] indices.
#[derive(Debug, Clone, Default)]
pub struct ContextTree {
    nodes: Vec<ContextNode>,
    roots: Vec<u32>,
    /// (parent or `u32::MAX` for a root, function) → child.
    index: FastMap<(u32, u32), u32>,
}

impl ContextTree {
    /// Adds one sample whose stack is `stack` (outermost first), weighing `weight_ns`.
    pub fn add(&mut self, stack: &[u32], weight_ns: u64) {
        self.add_following(stack, weight_ns, &[], &mut Vec::new());
    }

    /// Adds one sample like [`add`](Self::add), given the same thread's previous stack
    /// `previous` and the nodes it went through, `path` (which becomes this sample's):
    /// the outer part the two stacks share takes the same nodes without looking each
    /// context up again — most of the cost of a deep stack.
    pub fn add_following(
        &mut self,
        stack: &[u32],
        weight_ns: u64,
        previous: &[u32],
        path: &mut Vec<u32>,
    ) {
        let shared = stack
            .iter()
            .zip(previous)
            .take_while(|(now, before)| now == before)
            .count()
            .min(path.len());
        path.truncate(shared);
        for &node in path.iter() {
            let node = &mut self.nodes[node as usize];
            node.samples += 1;
            node.weight_ns += weight_ns;
        }
        let mut parent = path.last().copied().unwrap_or(u32::MAX);
        for &function in &stack[shared..] {
            let child = self.child_of(parent, function);
            let node = &mut self.nodes[child as usize];
            node.samples += 1;
            node.weight_ns += weight_ns;
            path.push(child);
            parent = child;
        }
        if parent != u32::MAX {
            let leaf = &mut self.nodes[parent as usize];
            leaf.self_samples += 1;
            leaf.self_weight_ns += weight_ns;
        }
    }

    /// The context of `function` called from `parent` (`u32::MAX`: a root), made if new.
    fn child_of(&mut self, parent: u32, function: u32) -> u32 {
        if let Some(&child) = self.index.get(&(parent, function)) {
            return child;
        }
        let child = self.nodes.len() as u32;
        self.nodes.push(ContextNode {
            function,
            ..Default::default()
        });
        self.index.insert((parent, function), child);
        match parent {
            u32::MAX => self.roots.push(child),
            _ => self.nodes[parent as usize].children.push(child),
        }
        child
    }

    /// The tree as profile nodes, children by weight (largest first).
    pub fn to_nodes(&self, functions: &FunctionTable) -> Vec<Node> {
        let mut built: Vec<Option<Node>> = (0..self.nodes.len()).map(|_| None).collect();
        let take = |built: &mut Vec<Option<Node>>, indices: &[u32]| -> Vec<Node> {
            let mut nodes: Vec<Node> = indices
                .iter()
                .map(|&i| built[i as usize].take().expect("a child is built first"))
                .collect();
            nodes.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.name.cmp(&b.name)));
            nodes
        };
        for index in (0..self.nodes.len()).rev() {
            let context = &self.nodes[index];
            let (name, module) = functions.name(context.function);
            let mut node = Node::leaf(name, module, 0, context.weight_ns, context.self_weight_ns);
            node.samples = Some(context.samples);
            node.address = functions.address(context.function);
            node.jit = module == JIT_MODULE;
            node.children = take(&mut built, &context.children);
            built[index] = Some(node);
        }
        take(&mut built, &self.roots)
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// Self and total samples of one function over all its contexts (for `top`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FunctionCounts {
    pub self_samples: u64,
    /// Samples with the function anywhere on the stack (counted once per sample).
    pub total_samples: u64,
}

/// Everything the samples of one session built: per-thread trees, the merged tree and
/// per-function counts.
#[derive(Default)]
pub struct SampledTrees {
    pub functions: FunctionTable,
    pub threads: BTreeMap<u32, ContextTree>,
    pub merged: ContextTree,
    counts: Vec<FunctionCounts>,
    /// The sample number that last counted each function's total (once per sample).
    counted_in: Vec<u64>,
    pub samples: u64,
    /// Each thread's last stack and the nodes it went through in its tree and in the
    /// merged tree (see [`ContextTree::add_following`]).
    last: FastMap<u32, LastSample>,
}

/// A thread's last sample: its stack and its paths of nodes.
#[derive(Default)]
struct LastSample {
    stack: Vec<u32>,
    thread_path: Vec<u32>,
    merged_path: Vec<u32>,
}

impl SampledTrees {
    /// Adds one sample of thread `tid` (stack outermost first).
    pub fn add(&mut self, tid: u32, stack: &[u32], weight_ns: u64) {
        self.samples += 1;
        let last = self.last.entry(tid).or_default();
        self.threads.entry(tid).or_default().add_following(
            stack,
            weight_ns,
            &last.stack,
            &mut last.thread_path,
        );
        self.merged
            .add_following(stack, weight_ns, &last.stack, &mut last.merged_path);
        last.stack.clear();
        last.stack.extend_from_slice(stack);
        let needed = self.functions.len();
        if self.counts.len() < needed {
            self.counts.resize(needed, FunctionCounts::default());
            self.counted_in.resize(needed, 0);
        }
        for &function in stack {
            let i = function as usize;
            if self.counted_in[i] != self.samples {
                self.counted_in[i] = self.samples;
                self.counts[i].total_samples += 1;
            }
        }
        if let Some(&leaf) = stack.last() {
            self.counts[leaf as usize].self_samples += 1;
        }
    }

    /// Each function's counts, with its index in [`SampledTrees::functions`], in no
    /// particular order.
    pub fn function_counts(&self) -> impl Iterator<Item = (u32, FunctionCounts)> {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, counts)| counts.total_samples > 0)
            .map(|(i, &counts)| (i as u32, counts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_functions_of_one_name_and_module_are_two_functions() {
        // `static` functions of two files, told apart by their entries.
        let mut functions = FunctionTable::new();
        let here = functions.intern("step", "app", Some(0x1210));
        let other = functions.intern("step", "app", Some(0x1260));
        assert_ne!(here, other);
        assert_eq!(functions.intern("step", "app", Some(0x1210)), here);
        assert_eq!(
            (functions.address(here), functions.address(other)),
            (Some(0x1210), Some(0x1260))
        );
    }

    #[test]
    fn samples_build_paths_and_count_recursion_once_per_sample() {
        let mut trees = SampledTrees::default();
        let main = trees.functions.intern("main", "app", Some(0x10));
        let work = trees.functions.intern("work", "app", Some(0x20));
        let leaf = trees.functions.intern("leaf", "app", None);
        trees.add(1, &[main, work, leaf], 10);
        trees.add(1, &[main, work, work], 10);
        trees.add(2, &[main], 10);
        let roots = trees.merged.to_nodes(&trees.functions);
        assert_eq!(roots.len(), 1);
        let main_node = &roots[0];
        assert_eq!(
            (main_node.samples, main_node.total_ns, main_node.self_ns),
            (Some(3), 30, 10)
        );
        assert_eq!(main_node.address, Some(0x10));
        let work_node = &main_node.children[0];
        assert_eq!(work_node.samples, Some(2));
        assert_eq!(work_node.children.len(), 2);
        let counts: HashMap<&str, FunctionCounts> = (trees.function_counts())
            .map(|(i, c)| (trees.functions.name(i).0, c))
            .collect();
        assert_eq!(
            counts["work"],
            FunctionCounts {
                self_samples: 1,
                total_samples: 2
            }
        );
        assert_eq!(
            counts["main"],
            FunctionCounts {
                self_samples: 1,
                total_samples: 3
            }
        );
        assert_eq!(trees.threads.len(), 2);
    }

    #[test]
    fn following_the_previous_sample_builds_the_trees_looking_every_context_up_builds() {
        let mut trees = SampledTrees::default();
        let f: Vec<u32> = (0..6)
            .map(|i| trees.functions.intern(&format!("f{i}"), "app", None))
            .collect();
        // Two threads' stacks, interleaved: shared outer parts, a changed middle frame,
        // a shorter and a longer stack, recursion, and an empty stack.
        let samples: [(u32, Vec<u32>); 9] = [
            (1, vec![f[0], f[1], f[2], f[3]]),
            (2, vec![f[0], f[1], f[2]]),
            (1, vec![f[0], f[1], f[2], f[4]]),
            (1, vec![f[0], f[5], f[2], f[4]]),
            (2, vec![f[0], f[1]]),
            (1, vec![f[0], f[5], f[5], f[5], f[5]]),
            (2, vec![]),
            (2, vec![f[0], f[1], f[2], f[3], f[4]]),
            (1, vec![f[0], f[5], f[5]]),
        ];
        let mut plain_threads: BTreeMap<u32, ContextTree> = BTreeMap::new();
        let mut plain_merged = ContextTree::default();
        for (tid, stack) in &samples {
            trees.add(*tid, stack, 7);
            plain_threads.entry(*tid).or_default().add(stack, 7);
            plain_merged.add(stack, 7);
        }
        let nodes = |tree: &ContextTree| tree.to_nodes(&trees.functions);
        assert_eq!(nodes(&trees.merged), nodes(&plain_merged));
        for (tid, tree) in &plain_threads {
            assert_eq!(nodes(&trees.threads[tid]), nodes(tree), "thread {tid}");
        }
    }
}
