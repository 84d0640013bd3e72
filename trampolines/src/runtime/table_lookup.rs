//! The controller's function table as discovery reads it: which of its entries still
//! describe the code loaded now (`FreshTable`), and the function a branch or a pointer
//! enters (`resolve`: a PLT stub followed to where it leads, the loader's, the vDSO's
//! and the agent's own code left out).

use crate::sys::code_memory;
use crate::sys::loaded_modules::{self, LoadedCode};
use tendril_callgraph::callees;
use tendril_wire::function_table::{FLAG_EXCLUDED, FLAG_PLT, FunctionEntry, FunctionTable};

/// Which of the table's addresses still hold what the table says: all of them while
/// no library has been unloaded since the table came; otherwise those in a library
/// loaded then and loaded now in the same place (a library unloaded since, maybe with
/// another loaded where it was, is not the code the table describes).
pub struct FreshTable<'a> {
    then: &'a [LoadedCode],
    now: Option<Vec<LoadedCode>>,
}

impl FreshTable<'_> {
    /// A table that came with the libraries' code `then`, when the loader had unloaded
    /// `unloads_then` libraries; it has unloaded `unloads` now.
    pub fn new(then: &[LoadedCode], unloads_then: u64, unloads: u64) -> FreshTable<'_> {
        FreshTable {
            then,
            now: (unloads != unloads_then).then(loaded_modules::loaded_code),
        }
    }

    /// Whether the table's function at `address` is still the code there.
    pub fn holds(&self, address: u64) -> bool {
        let Some(now) = &self.now else {
            return true;
        };
        let within = |code: &&LoadedCode| (code.start..code.end).contains(&address);
        match (self.then.iter().find(within), now.iter().find(within)) {
            (Some(then), Some(now)) => then == now,
            // Code no library holds (the table has only libraries' functions).
            _ => false,
        }
    }
}

/// The function a branch to `target` enters: a function of the table that starts
/// there, with PLT stubs followed to where they lead. `None` for the loader, the vDSO,
/// the agent itself, or an address that starts no known function.
pub fn resolve(target: u64, table: &FunctionTable) -> Option<FunctionEntry> {
    let entry = table.starting_at(target)?;
    let entry = if entry.flags & FLAG_PLT != 0 {
        let bound = plt_destination(&entry).and_then(|d| table.starting_at(d));
        match bound.filter(|b| b.flags & FLAG_PLT == 0) {
            Some(bound) => bound,
            None if entry.target != 0 => table.starting_at(entry.target)?,
            None => return None,
        }
    } else {
        entry
    };
    let excluded = entry.flags & (FLAG_EXCLUDED | FLAG_PLT) != 0 || entry.size == 0;
    (!excluded && !crate::sys::own_code::is_agent_code(entry.start)).then_some(entry)
}

/// Where a PLT stub jumps now: the pointer in its GOT slot.
fn plt_destination(stub: &FunctionEntry) -> Option<u64> {
    let mut code = vec![0u8; stub.size.clamp(1, 32) as usize];
    code_memory::read_code(stub.start, &mut code).ok()?;
    callees::plt_slot(&code, stub.start).and_then(read_pointer)
}

/// The 8-byte word at `address` of the target's memory, if it can be read.
pub fn read_pointer(address: u64) -> Option<u64> {
    let mut word = [0u8; 8];
    code_memory::read_code(address, &mut word).ok()?;
    Some(u64::from_le_bytes(word))
}
