// What each execution state means to a person, grouped the way the Activity view colours them:
// the uncertain states (the outcome is not known, or the agent may not have the result) are
// visibly distinct, because they are where a person may have to act.

import type { ExecutionState } from './bindings/ExecutionState';

export type StateGroup = 'progress' | 'done' | 'uncertain' | 'stopped';

// Every state has its group: a state added to the Rust type fails the type check until it does.
const groups: Record<ExecutionState, StateGroup> = {
  accepted: 'progress',
  authorized: 'progress',
  dispatched: 'progress',
  completed: 'done',
  result_delivered: 'done',
  completed_result_not_delivered: 'uncertain',
  outcome_unknown: 'uncertain',
  needs_review: 'uncertain',
  denied: 'stopped',
  failed_before_dispatch: 'stopped',
  not_executed: 'stopped',
};

/** The group of a state (or of a journal event that is not a state: `progress`). */
export function groupOf(state: string): StateGroup {
  return groups[state as ExecutionState] ?? 'progress';
}

/** The legend, in the order a call moves through them. */
export const legend: [StateGroup, string][] = [
  ['progress', 'under way: accepted, authorized, dispatched'],
  ['done', 'completed (and delivered)'],
  ['uncertain', 'needs a look: outcome unknown, needs review, result not delivered'],
  ['stopped', 'never sent: denied, failed before dispatch, not executed'],
];
