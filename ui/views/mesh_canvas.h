// The mesh canvas: the device mesh drawn as node boxes holding device tiles, each tile coloured by the
// pipeline stage of the rank on it and labelled with its rank, stage, tp and dp indices and its stage's
// layers; tensor-parallel groups are outlined, links and their bandwidths are written on the node boxes and
// in the legend. It is where the mesh is edited (toolbar actions and a context menu) and where layers dragged
// from the layer palette are dropped: a drop on a device puts the layers on that device's stage.
//
// What always holds: the canvas never keeps its own copy of a setting; it redraws from
// ProjectDocument::config() after every configChanged(), and every edit goes through the document (so it
// is undoable); a refused edit or drop changes nothing, and says why (lastRefusal(), dropRefused() and a
// message on the canvas); a message about an edit disappears when the project changes again (undo, another
// edit, another project) or after kMessageMillis. Drawing costs one QGraphicsItem per node (tiles are
// painted by their node at a level of detail that suits the zoom, text always in the UI font's own size),
// so a 16384-device mesh stays responsive. While the view fits the mesh (the default, and after Fit) it has
// no scroll bars, so a resize refits once and never starts a scroll-bar/resize loop; zooming in brings the
// scroll bars back. The legend (links, layout, the stages' colours and layers) is text for a panel beside
// the canvas (legendHtml(), legendChanged()), so it never covers a tile.
#pragma once

#include <QColor>
#include <QGraphicsView>
#include <QString>
#include <QStringList>
#include <memory>
#include <vector>

#include "plan/memory_model.h"
#include "ui/models/mesh_geometry.h"
#include "ui/models/mesh_model.h"
#include "ui/models/plan_analysis.h"  // the snapshot slot needs its metatype declaration

class QAction;
class QGraphicsItem;
class QMenu;
class QTimer;

namespace ms {

class ProjectDocument;

class MeshCanvas : public QGraphicsView {
  Q_OBJECT
 public:
  MeshCanvas(ProjectDocument* doc, QWidget* parent = nullptr);
  ~MeshCanvas() override;

  // --- What is drawn (also what the tests read). ---
  const MeshGeometry& meshGeometry() const { return m_geometry; }
  const MeshRanks& ranks() const { return m_ranks; }
  int stageOfDevice(int device) const;  // of its (first) rank; -1 when idle or without a layout
  // The stages of every rank on the device, increasing and distinct (several when ranks of different stages
  // share it); empty when idle.
  std::vector<int> stagesOfDevice(int device) const;
  QString tileLabel(int device) const;  // the tile's text lines, "\n"-separated, most important first
  QString groupsText(int rank) const;
  QString tileToolTip(int device) const;
  QColor tileColor(int device) const;  // the stage's colour, grey when idle
  static QColor stageColor(int stage);
  QString stageLayers(int stage) const;   // "emb, b0-b3" (chunks joined by " + ")
  QString nodeHeader(int node) const;     // "node000 · h100-sxm-80gb × 8 · nvlink · 370 GB/s · 3 µs"
  QString nodeShortName(int node) const;  // the node's name (drawn over a zoomed-out node)
  // The legend: the links, the rank layout, then one line per stage with its colour and layers. Plain text
  // (for tests and tooltips) and the same as rich text with colour swatches (for the legend panel).
  QString legendText() const { return m_legendText; }
  QString legendHtml() const { return m_legendHtml; }
  // True while the view shows the whole mesh (no scroll bars) rather than a zoom the person chose.
  bool fitsView() const { return !m_userZoomed; }
  // How many lines of a tile's label are drawn at the current zoom (text is drawn in the UI font at its own
  // size, so a line that would be smaller is left out, never shrunk); 0 when tiles are too small for text.
  int tileLinesShown() const;
  QString intraLinkText() const { return m_intraText; }  // "nvlink · 370 GB/s · 3 µs"
  QString interLinkText() const { return m_interText; }
  bool deviceFits(int device) const;  // false when the snapshot says its rank exceeds its memory
  int highlightedDevice() const { return m_highlight; }  // under a drag, else -1
  bool highlightAcceptable() const;                      // the highlighted device holds a stage
  int selectedNode() const { return m_selectedNode; }
  int selectedDevice() const { return m_selectedDevice; }
  QString lastRefusal() const { return m_lastRefusal; }
  QString messageText() const;
  bool messageVisible() const;

  // --- Actions for a toolbar (each works on the selected node or device). ---
  QAction* addNodeAction() const { return m_addNode; }
  QAction* duplicateNodeAction() const { return m_duplicateNode; }
  QAction* removeNodeAction() const { return m_removeNode; }
  QAction* addDeviceAction() const { return m_addDevice; }
  QAction* removeDeviceAction() const { return m_removeDevice; }
  QAction* deviceTypeAction() const { return m_deviceType; }  // its menu: the types, then "New..."
  QAction* linksAction() const { return m_links; }            // its menu: intra and inter-node links
  QAction* zoomInAction() const { return m_zoomIn; }
  QAction* zoomOutAction() const { return m_zoomOut; }
  QAction* fitAction() const { return m_fit; }
  QList<QAction*> editActions() const;  // in toolbar order, separators included

  // --- Edits; each returns false (and says why, like a refused drop) when refused. ---
  bool addNode();  // like the selected node, or the last
  bool duplicateNode(int node);
  bool removeNode(int node);
  bool addDevice(int node);
  bool removeDevice(int device);
  bool setNodeDeviceType(int node, const QString& type);
  bool defineDeviceType(const DeviceTypeConfig& type, int applyToNode = -1);
  bool setLink(bool intra, const QString& name);
  bool defineLinkType(const LinkTypeConfig& type, bool intra);
  // The drop itself: layers [first, last] onto the stage of `device` (-1: empty space).
  bool dropLayers(int first, int last, int device);
  // Parameter-server mode: one more server, on this node; or the last server on this node removed (refused
  // when it is the only server, or none is there). The placement is written to parallel.server_nodes.
  bool addServer(int node);
  bool removeServer(int node);

  void selectDevice(int device);  // also selects its node; -1 clears
  void selectNode(int node);      // clears the device selection

 public slots:
  // Adds the plan analysis' memory figures (over-capacity tiles are marked). Ignored for a stale snapshot.
  void setSnapshot(std::shared_ptr<const ms::PlanSnapshot> snapshot);
  void zoomIn();
  void zoomOut();
  void fitAll();

 signals:
  void dropRefused(const QString& reason);
  void legendChanged();
  void layersPlaced(const QString& description);
  void selectionChanged(int node, int device);

 protected:
  void wheelEvent(QWheelEvent* event) override;
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dragMoveEvent(QDragMoveEvent* event) override;
  void dragLeaveEvent(QDragLeaveEvent* event) override;
  void dropEvent(QDropEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void contextMenuEvent(QContextMenuEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;
  bool viewportEvent(QEvent* event) override;
  void scrollContentsBy(int dx, int dy) override;
  void resizeEvent(QResizeEvent* event) override;
  void showEvent(QShowEvent* event) override;

 private:
  void rebuild();
  void createActions();
  void updateActions();
  void fillDeviceTypeMenu(QMenu* menu, int node);
  void fillLinkMenu(QMenu* menu, bool intra);
  void askDeviceType(int node);
  void askLinkType(bool intra);
  bool applyMesh(const QString& text, const MeshConfig& mesh);
  bool refuse(const QString& reason);
  void showMessage(const QString& text, bool error);
  void hideMessage();
  void setFitMode(bool fit);  // fit: no scroll bars, the mesh refitted on resize
  void setHighlight(int device);
  void placeOverlays();
  void updateDevice(int device);
  int targetNode() const;  // the selected node, else the last

  ProjectDocument* m_doc;
  QGraphicsScene* m_scene;
  MeshGeometry m_geometry;
  MeshRanks m_ranks;
  QStringList m_stageLayers;  // per stage
  QStringList m_nodeHeaders;  // per node
  QString m_intraText, m_interText;
  std::vector<MemoryBreakdown> m_memory;  // per rank, from a snapshot of the current config
  std::vector<QGraphicsItem*> m_nodeItems;
  QString m_legendText, m_legendHtml;
  QGraphicsItem* m_message = nullptr;
  QTimer* m_messageTimer = nullptr;
  quint64 m_messageRevision = 0;  // the document revision the shown message is about
  int m_highlight = -1;
  int m_selectedNode = -1;
  int m_selectedDevice = -1;
  bool m_userZoomed = false;
  QString m_lastRefusal;
  QAction *m_addNode, *m_duplicateNode, *m_removeNode, *m_addDevice, *m_removeDevice, *m_deviceType, *m_links,
      *m_zoomIn, *m_zoomOut, *m_fit;
  QAction* m_separators[2];
};

}  // namespace ms
