/**
 * The scheduler's cell map: cell numbers, assigned in join order, and the device each stands
 * for (one device per cell), with the role each serves as the journaled records say.
 *
 * The policy sees cells as numbers; the map is what the scheduler adds to act on its answers:
 * which device a `SwitchRole` goes to, the hand-off destinations of a cell leaving rollout,
 * the devices that load published weights, and the rollout slots the dispatcher may fill.
 * It changes only by folding records in (`Book.apply`), live and on takeover alike.
 */
import type { CellRole } from "../policy/vocabulary.ts"

export interface Cell {
  readonly cell: number
  /** The device actor's address, `device/<node>.<i>`. */
  readonly device: string
  /** The device's incarnation when it joined, if it said. */
  readonly incarnation: number | undefined
  /** Where it is going while `switching`. */
  role: CellRole
  switching: boolean
  /** Index of the record that asked for its last switch (names that switch's completion). */
  switchIndex: number
}

export class CellMap {
  /** Live cells in join order (a Map keeps insertion order). */
  private readonly cells = new Map<number, Cell>()
  private readonly byDevice = new Map<string, number>()
  private nextCell = 0

  /** The number the next joining device gets (numbers are never reused). */
  get next(): number {
    return this.nextCell
  }

  get(cell: number): Cell | undefined {
    return this.cells.get(cell)
  }

  /** The live cell of `device`, if it has one. */
  cellOf(device: string): number | undefined {
    return this.byDevice.get(device)
  }

  list(): ReadonlyArray<Cell> {
    return [...this.cells.values()]
  }

  join(cell: number, device: string, incarnation: number | undefined): void {
    this.cells.set(cell, { cell, device, incarnation, role: "rollout", switching: false, switchIndex: -1 })
    this.byDevice.set(device, cell)
    this.nextCell = Math.max(this.nextCell, cell + 1)
  }

  lose(cell: number): void {
    const c = this.cells.get(cell)
    if (c === undefined) return
    this.cells.delete(cell)
    this.byDevice.delete(c.device)
  }

  startSwitch(cell: number, role: CellRole, index: number): void {
    const c = this.cells.get(cell)
    if (c === undefined) return
    c.role = role
    c.switching = true
    c.switchIndex = index
  }

  endSwitch(cell: number, role: CellRole): void {
    const c = this.cells.get(cell)
    if (c === undefined) return
    c.role = role
    c.switching = false
  }

  /** Cells serving rollouts now (role rollout, not switching): the rollout slots are theirs. */
  get serving(): number {
    let n = 0
    for (const c of this.cells.values()) if (c.role === "rollout" && !c.switching) n++
    return n
  }

  /**
   * Where a cell leaving rollout hands its contexts: the other serving cells, the one that
   * stays in rollout longest first (cells leave in join order, so the highest number first).
   */
  destinations(leaving: number): Array<string> {
    return this.list()
      .filter((c) => c.cell !== leaving && c.role === "rollout" && !c.switching)
      .sort((a, b) => b.cell - a.cell)
      .map((c) => c.device)
  }

  /** Cells in the rollout role or on their way to it: they load every published version. */
  rolloutCells(): Array<Cell> {
    return this.list().filter((c) => c.role === "rollout")
  }
}
